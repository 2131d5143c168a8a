"""Spread a model over devices and run it: in-place blocks, moving activations, offloaded blocks.

model = load_checkpoint_and_dispatch(model, "ckpt_dir", device_map="auto",
                                     no_split_module_classes=["LlamaDecoderLayer"])
model.hf_device_map         # {'model.embed_tokens': 0, ..., 'model.layers.30': 'cpu', ...}
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .dispatch_hooks import attach_device_hook, remove_device_hooks
from .offload import DEFAULT_NUM_BUFFERS, OffloadEngine, OffloadUnit
from .planning.device_map import (
    DeviceMapError,
    check_device_map,
    check_devices_exist,
    known_entries,
    resolve_device_map,
)
from .planning.sizes import get_max_memory, normalize_device, torch_device
from .rollback import restore, snapshot
from .units import DISK_INDEX, build_unit, move_tensor, save_for_disk
from .units import hook_targets as _hook_targets
from .units import is_container as _is_container
from .units import offload_targets as _offload_targets
from .units import tensor_slots as _tensor_slots

_ENGINE = "_accel_nb_engine"


def _resolve(
    model: nn.Module, name: str, modules: dict[str, nn.Module]
) -> tuple[nn.Module | None, nn.Module, str | None]:
    """(module, owner, attr): a module entry gives (module, module, None); a tensor entry (None, owner, attr)."""
    if name == "":
        return model, model, None
    if name in modules:
        return modules[name], modules[name], None
    owner_name, _, attr = name.rpartition(".")
    owner = modules.get(owner_name)
    if owner is None or (attr not in owner._parameters and attr not in owner._buffers):
        raise DeviceMapError(f"device_map entry {name!r} is neither a module nor a tensor of the model")
    return None, owner, attr


def remove_dispatch(model: nn.Module) -> None:
    """Remove hooks and offload buffers added by dispatch_model / cpu_offload / disk_offload."""
    remove_device_hooks(model)
    engine = getattr(model, _ENGINE, None)
    if engine is not None:
        engine.close()
        del model._accel_nb_engine


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, Any],
    main_device: Any = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike | None = None,
    offload_index: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    *,
    no_split_module_classes: Iterable[str | type] | None = None,
    num_buffers: int = DEFAULT_NUM_BUFFERS,
    prefetch: bool = True,
    buffered: bool | None = None,
) -> nn.Module:
    """Put each mapped module on its device and hook the model so it runs across them.

        model = dispatch_model(model, {"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "head": "disk"},
                               offload_dir="offload")
    GPU (and accelerator) entries run in place; inputs are moved to each module's device. CPU and
    disk entries are offloaded: their weights come to ``main_device`` (the first GPU of the map, or
    the CPU when there is none) only for their forward. With no GPU, 'cpu' entries run in place.
    The model's outputs come back to the device of its inputs. Sets ``model.hf_device_map``.
    ``num_buffers`` bounds the execution-device buffers for offloaded weights; ``buffered=True``
    runs that streaming path even on a CPU execution device (used by the tests). ``skip_keys``:
    input keys never moved between devices (e.g. "past_key_values").
    """
    if state_dict is not None or offload_index is not None:
        raise ValueError(
            "dispatch_model(state_dict=..., offload_index=...) is not supported: load weights with "
            "load_checkpoint_in_model(model, checkpoint, device_map=...) first (disk entries are then read "
            "straight from the checkpoint's safetensors files)"
        )
    if isinstance(device_map, str):
        device_map = resolve_device_map(model, device_map)
    device_map = {name: normalize_device(dev) for name, dev in device_map.items()}
    check_device_map(model, device_map)
    device_map = known_entries(model, device_map)  # keys naming nothing are ignored, as by the reference
    check_devices_exist(
        list(device_map.values()) + ([main_device] if main_device is not None else []), "device_map"
    )
    remove_dispatch(model)
    if no_split_module_classes is None:
        no_split_module_classes = getattr(model, "_no_split_modules", None)
    in_place_devices = [d for d in device_map.values() if d not in ("cpu", "disk")]
    if main_device is None:
        gpus = sorted(d for d in in_place_devices if isinstance(d, int))
        main_device = gpus[0] if gpus else (in_place_devices[0] if in_place_devices else "cpu")
    exec_device = torch_device(normalize_device(main_device))
    if exec_device.type == "cuda" and exec_device.index is None:
        exec_device = torch.device("cuda", 0)
    engine = OffloadEngine(exec_device, num_buffers=num_buffers, prefetch=prefetch, buffered=buffered)
    placer = _Placer(
        model,
        engine,
        list(no_split_module_classes or []),
        offload_buffers,
        os.fspath(offload_dir) if offload_dir is not None else None,
        skip_keys,
    )
    snap = snapshot(model)
    try:
        for name, dev in device_map.items():  # map order: the order the prefetcher starts from
            placer.place(name, dev)
        engine.finalize()
    except BaseException:
        restore(model, snap)  # no half dispatch: same tensors, no hooks
        engine.close()
        raise
    attach_device_hook(model, io_same_device=True, skip_keys=skip_keys)
    model.hf_device_map = dict(device_map)
    model._accel_nb_engine = engine
    return model


class _Placer:
    """Puts one map entry in place: moved and hooked (GPU, or CPU on a CPU run) or offloaded."""

    def __init__(
        self, model, engine: OffloadEngine, no_split, offload_buffers, offload_dir, skip_keys
    ) -> None:
        self.model = model
        self.engine = engine
        self.no_split = no_split
        self.offload_buffers = offload_buffers
        self.offload_dir = offload_dir
        self.skip_keys = skip_keys
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def place(self, name: str, dev: Any) -> None:
        module, owner, attr = _resolve(self.model, name, self.modules)
        exec_device = self.engine.device
        if dev not in ("cpu", "disk") or (dev == "cpu" and exec_device.type == "cpu"):
            self._in_place(name, module, owner, attr, torch_device(dev))
        elif attr is not None:
            self._offload(name, owner, attr, dev, hook_on=owner)
        else:
            for target_name, target, direct_only in _offload_targets(name, module, self.no_split):
                self._offload(target_name, target, None, dev, hook_on=target, direct_only=direct_only)

    def _in_place(self, name, module, owner, attr, device: torch.device) -> None:
        if attr is not None:
            move_tensor(owner, attr, attr in owner._parameters, name, device)
            return
        for full, o, a, is_param, _ in _tensor_slots(module, name):
            move_tensor(o, a, is_param, full, device)
        for _, target in _hook_targets(name, module):
            attach_device_hook(target, device, skip_keys=self.skip_keys)

    def _offload(self, name, module, attr, dev, hook_on, direct_only: bool = False) -> None:
        unit = build_unit(
            self.model,
            name,
            module,
            attr,
            dev,
            self.engine.device,
            self.offload_buffers,
            self.offload_dir,
            self.placeholders,
            direct_only,
        )
        if unit is None and attr is not None:
            return
        attach_device_hook(hook_on, self.engine.device, unit, self.engine, skip_keys=self.skip_keys)
        if unit is not None:
            self.engine.add_unit(unit)


def cpu_offload(
    model: nn.Module,
    execution_device: Any = None,
    offload_buffers: bool = False,
    num_buffers: int = DEFAULT_NUM_BUFFERS,
    buffered: bool | None = None,
    preload_module_classes: list[str] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """Keep all weights in (pinned) CPU memory; stream each layer to ``execution_device`` for its forward.

    model = cpu_offload(model, execution_device=0)   # uses ~2 layers of GPU memory

    ``preload_module_classes`` (class names) makes a module of such a class bring in the weights
    of its whole subtree for its forward, for modules that read a child's weights without calling
    the child. ``state_dict`` is accepted only as ``None`` (accel_nb reads the model's own tensors).
    """
    if state_dict is not None:
        raise ValueError(
            "cpu_offload(state_dict=...) is not supported: accel_nb offloads the tensors the model holds; "
            "load them into the model first (model.load_state_dict(state_dict)) and call cpu_offload(model)"
        )
    if execution_device is None:
        execution_device = 0 if torch.cuda.is_available() else "cpu"
    return _offload_all(
        model, "cpu", execution_device, None, offload_buffers, num_buffers, buffered, preload_module_classes
    )


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike,
    execution_device: Any = None,
    offload_buffers: bool = False,
    num_buffers: int = DEFAULT_NUM_BUFFERS,
    buffered: bool | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep all weights in memory-mapped safetensors under ``offload_dir``; load each layer for its forward.

    model = disk_offload(model, "offload", execution_device="cpu")

    ``preload_module_classes`` works as in :func:`cpu_offload`.
    """
    if execution_device is None:
        execution_device = 0 if torch.cuda.is_available() else "cpu"
    return _offload_all(
        model,
        "disk",
        execution_device,
        os.fspath(offload_dir),
        offload_buffers,
        num_buffers,
        buffered,
        preload_module_classes,
    )


def _offload_all(
    model: nn.Module,
    source: str,
    execution_device: Any,
    offload_dir: str | None,
    offload_buffers: bool,
    num_buffers: int,
    buffered: bool | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    check_devices_exist([execution_device], "execution_device")
    remove_dispatch(model)
    exec_device = torch_device(normalize_device(execution_device))
    engine = OffloadEngine(exec_device, num_buffers=num_buffers, buffered=buffered)
    snap = snapshot(model)
    try:
        if source == "disk":
            _write_model_for_disk(model, offload_dir, offload_buffers)
        _offload_every_module(model, source, engine, offload_buffers, offload_dir, preload_module_classes)
        engine.finalize()
    except BaseException:
        restore(model, snap)
        engine.close()
        raise
    attach_device_hook(model, exec_device, io_same_device=True)
    model.hf_device_map = {"": "disk" if source == "disk" else "cpu"}
    model._accel_nb_engine = engine
    return model


def _write_model_for_disk(model: nn.Module, offload_dir: str | None, offload_buffers: bool) -> None:
    """One safetensors file for every in-memory weight not already in a safetensors file."""
    disk_index: dict[str, tuple[str, str]] = dict(getattr(model, DISK_INDEX, {}))
    pending: dict[str, torch.Tensor] = {}
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for full, _, _, is_param, t in _tensor_slots(model, ""):
        if t.device.type != "meta":
            # in memory again (e.g. after remove_hook_from_submodules): an earlier folder is stale
            disk_index.pop(full, None)
        if not (is_param or offload_buffers) or t.device.type == "meta":
            continue
        if id(t) in first:
            tied[full] = first[id(t)]
            continue
        first[id(t)] = full
        pending[full] = t
    if pending:
        path = save_for_disk(pending, offload_dir, "model")
        disk_index.update({k: (path, k) for k in pending})
        disk_index.update({k: (path, v) for k, v in tied.items()})
    model._accel_nb_disk_index = disk_index


def _offload_every_module(
    model: nn.Module,
    source: str,
    engine: OffloadEngine,
    offload_buffers: bool,
    offload_dir: str | None,
    preload_module_classes: list[str] | None = None,
) -> None:
    """One streaming unit per module that holds tensors directly (its children are units of their own),
    or per module of a ``preload_module_classes`` class (its whole subtree is one unit)."""
    placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    preload = set(preload_module_classes or [])
    preloaded: list[str] = []
    for name, module in model.named_modules(remove_duplicate=False):
        if any(p == "" or name.startswith(p + ".") for p in preloaded):
            continue  # inside a preloaded module: its weights come with the parent's unit
        if type(module).__name__ in preload:
            preloaded.append(name)
            whole = build_unit(
                model, name, module, None, source, engine.device, offload_buffers, offload_dir, placeholders
            )
            if whole is not None:
                engine.add_unit(whole)
            attach_device_hook(module, engine.device, whole, engine)
            continue
        direct = [
            a for a, t in list(module._parameters.items()) + list(module._buffers.items()) if t is not None
        ]
        if not direct:
            continue
        unit = OffloadUnit(name, module, source)
        for attr in direct:
            full = f"{name}.{attr}" if name else attr
            part = build_unit(
                model, full, module, attr, source, engine.device, offload_buffers, offload_dir, placeholders
            )
            if part is not None:
                unit.slots += part.slots
                unit.host.update(part.host)
                unit.disk.update(part.disk)
        if unit.slots:
            engine.add_unit(unit)
            attach_device_hook(module, engine.device, unit, engine)
        elif not _is_container(module):
            attach_device_hook(module, engine.device)


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: str | Mapping[str, Any] | None = "auto",
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_buffers: bool = False,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    strict: bool = False,
    *,
    allow_pickle: bool = True,
) -> nn.Module:
    """Plan a device map, load the checkpoint straight onto it, and dispatch the model.

        with init_empty_weights():
            model = LlamaForCausalLM(config)
        model = load_checkpoint_and_dispatch(model, "llama_dir", device_map="auto",
                                             no_split_module_classes=["LlamaDecoderLayer"],
                                             offload_folder="offload")
    With ``offload_folder`` and a string device_map, modules that fit nowhere go to disk.
    GPUs named in ``max_memory`` or ``device_map`` must exist (checked before anything is read);
    if loading or dispatching fails, the model is left as it was (no tensor loaded, no hook).
    ``offload_state_dict`` is accepted for compatibility: shards are always read one at a time.
    """
    from .loading import load_checkpoint_tensors

    del offload_state_dict
    if max_memory is not None:
        check_devices_exist(get_max_memory(max_memory), "max_memory")
    if isinstance(device_map, str):
        budgets: dict[Any, Any] = dict(get_max_memory(max_memory))
        if offload_folder is not None and "disk" not in budgets:
            budgets["disk"] = 2**62
        device_map = resolve_device_map(
            model, device_map, budgets, no_split_module_classes, dtype, offload_buffers=offload_buffers
        )
    snap = snapshot(model)
    try:
        load_checkpoint_tensors(
            model,
            checkpoint,
            device_map,
            offload_folder,
            dtype,
            offload_buffers,
            None,
            strict,
            allow_pickle,
            True,
            in_place=False,
        )
        if device_map is not None:
            dispatch_model(
                model,
                device_map,
                offload_dir=offload_folder,
                offload_buffers=offload_buffers,
                skip_keys=skip_keys,
                no_split_module_classes=no_split_module_classes,
            )
    except BaseException:
        restore(model, snap)  # the model is as it was: nothing half-loaded, no hooks
        raise
    return model
