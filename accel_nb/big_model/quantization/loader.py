"""Load a checkpoint into a model, quantizing its linear layers as each shard is read.

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model = load_and_quantize_model(model, BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
                                    weights_location="ckpt_dir", device_map="auto")
Safetensors shards are memory-mapped one at a time; each linear weight is quantized straight
from the mapped file (no float copy on the heap), so host memory peaks near one shard plus the
quantized model. Every
check (settings, library, layers, names, shapes, a checkpoint quantized otherwise, the device map)
runs before any tensor is read, and the model is changed only once every shard has been read:
an error leaves it exactly as it was.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..dispatch import dispatch_model
from ..planning.device_map import (
    DeviceMapError,
    check_device_map,
    check_devices_exist,
    device_for,
    infer_auto_device_map,
)
from ..planning.sizes import Device, get_balanced_memory, normalize_device, torch_device
from ..rollback import restore, snapshot
from . import prequantized
from .backends import backend_for
from .config import QuantizationConfig, QuantizationError
from .layers import QuantTarget, find_targets, keeps_fp32, make_shell, quantize_weight, require
from .offload import OFFLOADER_ATTR, QuantizedOffloader
from .sizes import mark_quantized_sizes, special_dtypes_for, unmark_quantized_sizes
from .weight_source import ModelTensor, WeightSource, model_tensors, release_freed_memory

QUANTIZATION_ATTR = "accel_nb_quantization"  # set on a model this loader quantized: its config


def _listing(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def _is_quantized_model(model: nn.Module) -> bool:
    if getattr(model, QUANTIZATION_ATTR, None) is not None:
        return True
    return any(type(m).__name__ in ("Linear8bitLt", "Linear4bit") for m in model.modules()) or any(
        type(p).__name__ in ("Int8Params", "Params4bit", "Int8Tensor", "AffineQuantizedTensor", "Int4Tensor")
        for p in model.parameters()
    )


# -- checks, before anything is read ---------------------------------------------------------------------
def _match(
    model: nn.Module,
    source: WeightSource,
    tensors: dict[str, ModelTensor],
    saved_quantized: Mapping[str, Any],
) -> dict[str, list[ModelTensor]]:
    """saved name -> the model tensors it fills; raise on missing tensors and on shape mismatches.

    Weights that come saved quantized (``saved_quantized``: their layers' tensors) are not matched here.
    """
    wanted: dict[str, list[ModelTensor]] = {}
    missing, wrong = [], []
    for entry in dict.fromkeys(tensors.values()):
        if entry.names[0] in saved_quantized:
            continue
        saved = next((s for s in map(source.saved_name, entry.names) if s is not None), None)
        if saved is None:
            missing.append(entry.names[0])
            continue
        if source.shape[saved] != tuple(entry.tensor.shape):
            wrong.append(
                f"{entry.names[0]!r} is {list(source.shape[saved])} there but {list(entry.tensor.shape)} in the model"
            )
            continue
        wanted.setdefault(saved, []).append(entry)
    cls = type(model).__name__
    if missing:
        raise QuantizationError(
            f"{source.where} lacks {len(missing)} tensor(s) {cls} needs: {_listing(missing)}. Check that the "
            "checkpoint belongs to this model. Nothing was loaded"
        )
    if wrong:
        raise QuantizationError(
            f"shape mismatch between {source.where} and {cls}: {'; '.join(wrong[:4])}. Build the model with the "
            "config the checkpoint was saved with. Nothing was loaded"
        )
    unexpected = [n for n in source.dtype if n not in wanted and n not in saved_quantized]
    if unexpected:
        warnings.warn(
            f"load_and_quantize_model: {source.where} has tensors {cls} does not use: {_listing(unexpected)}",
            stacklevel=3,
        )
    return wanted


def _check_ties(targets: list[QuantTarget], tensors: dict[str, ModelTensor]) -> None:
    for t in targets:
        entry = tensors[f"{t.name}.weight"]
        others = [n for n in entry.names if n != f"{t.name}.weight"]
        if others:
            raise QuantizationError(
                f"{t.name!r} shares its weight with {others[0]!r} (tied weights), so it cannot be quantized alone; "
                f"add {t.name!r} to skip_modules (the default skip list does). Nothing was loaded"
            )


def _resolve_device_map(
    model, config, targets, fp32, device_map, max_memory, no_split_module_classes
) -> dict[str, Device]:
    if device_map is None:
        return {"": torch.cuda.current_device() if torch.cuda.is_available() else "cpu"}
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
            raise QuantizationError(
                f"device_map={device_map!r} is not known; use 'auto', 'balanced', 'balanced_low_0', "
                "'sequential' or a dict {module: device}"
            )
        if no_split_module_classes is None:
            no_split_module_classes = getattr(model, "_no_split_modules", None)
        marked = mark_quantized_sizes(model, config, targets)
        try:
            special = special_dtypes_for(model, config, fp32)
            budgets = max_memory
            if device_map != "sequential":
                budgets = get_balanced_memory(
                    model,
                    max_memory,
                    no_split_module_classes,
                    special_dtypes=special,
                    low_zero=device_map == "balanced_low_0",
                )
            return dict(
                infer_auto_device_map(model, budgets, no_split_module_classes, special_dtypes=special)
            )
        finally:
            unmark_quantized_sizes(marked)
    normalized = {k: normalize_device(v) for k, v in device_map.items()}
    try:
        check_device_map(model, normalized)
    except DeviceMapError as exc:
        raise QuantizationError(str(exc)) from None
    return normalized


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: QuantizationConfig,
    device_map: str | Mapping[str, Any] | None = None,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, Device]:
    """The device map ``load_and_quantize_model`` would use: planned with the quantized sizes.

        get_quantized_model_device_map(empty_model, BnbQuantizationConfig(load_in_4bit=True), "auto",
                                       max_memory={0: "6GiB", "cpu": "30GiB"})
    ``device_map`` None means the GPU if there is one, else the CPU (the reference requires a GPU);
    a dict is checked against the model and returned normalized. Nothing is loaded.
    """
    targets, _skip, fp32 = find_targets(model, bnb_quantization_config)
    return _resolve_device_map(
        model, bnb_quantization_config, targets, fp32, device_map, max_memory, no_split_module_classes
    )


@dataclass
class _Placement:
    """Where each tensor goes: the execution device, and which quantized layers are offloaded where."""

    device_map: dict[str, Device]
    exec_device: torch.device
    offloaded: dict[str, str]  # quantized layer -> "cpu" | "disk" (kept off the execution device)

    @property
    def dispatched(self) -> bool:
        return (
            len(set(self.device_map.values())) > 1
            or bool(self.offloaded)
            or "disk" in self.device_map.values()
        )

    def tensor_device(self, name: str) -> torch.device:
        """Where a float tensor is loaded: its device, or the CPU for disk and offloaded entries
        (the offload engine takes it from there)."""
        dev = device_for(self.device_map, name)
        if dev in ("cpu", "disk") or dev is None:
            return torch.device("cpu")
        return torch_device(dev)

    def layer_device(self, layer: str) -> torch.device:
        """Where a quantized layer is quantized: the execution device when it is offloaded (so its
        bytes are those the execution device would compute), else its own device."""
        if layer in self.offloaded:
            return self.exec_device
        return self.tensor_device(f"{layer}.weight")


def _check_placement(
    device_map: dict[str, Device], offload_folder: Any, targets: list[QuantTarget], config: QuantizationConfig
) -> _Placement:
    devices = list(dict.fromkeys(device_map.values()))
    check_devices_exist([d for d in devices if d != "disk"], "device_map")
    layer_names = {t.name for t in targets}
    split = [k for k in device_map if k.rpartition(".")[0] in layer_names]
    if split:
        raise QuantizationError(
            f"the device map places {_listing(split, 4)} on its own, a tensor of a layer that is quantized; a "
            "quantized layer's tensors go to one device together. Map the layer (or the block holding it) "
            "instead. Nothing was loaded"
        )
    if "disk" in devices and offload_folder is None:
        on_disk = [k for k, v in device_map.items() if v == "disk"]
        raise QuantizationError(
            f"the device map sends {_listing(on_disk, 4)} to 'disk' but no offload folder was given; pass "
            "offload_folder='some/folder' (quantized layers are written there in their quantized form, 2-4x "
            "smaller than in float). Nothing was loaded"
        )
    in_place = [d for d in devices if d not in ("cpu", "disk")]
    gpus = sorted(d for d in in_place if isinstance(d, int))
    exec_device = torch_device(gpus[0] if gpus else (in_place[0] if in_place else "cpu"))
    if exec_device.type == "cuda" and exec_device.index is None:
        exec_device = torch.device("cuda", 0)
    offloaded: dict[str, str] = {}
    for t in targets:
        dev = device_for(device_map, f"{t.name}.weight")
        if dev == "disk" or (dev == "cpu" and exec_device.type != "cpu"):
            offloaded[t.name] = dev
    refusal = backend_for(config).offload_refusal(config) if offloaded else None
    if refusal:
        raise QuantizationError(
            f"the device map offloads {_listing(list(offloaded), 4)} ({offloaded[next(iter(offloaded))]}), but "
            f"{refusal}. Nothing was loaded"
        )
    return _Placement(device_map, exec_device, offloaded)


# -- the load -----------------------------------------------------------------------------------------
def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: QuantizationConfig,
    weights_location: str | os.PathLike | None = None,
    device_map: str | Mapping[str, Any] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Mapping[Any, int | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantize ``model``'s linear layers with bitsandbytes or torchao while loading its weights.

        with init_empty_weights():
            model = LlamaForCausalLM(config)
        model = load_and_quantize_model(model, BnbQuantizationConfig(load_in_8bit=True),
                                        weights_location="ckpt", device_map="auto")
    ``bnb_quantization_config`` is a :class:`BnbQuantizationConfig` (8-bit LLM.int8, 4-bit NF4/FP4)
    or a :class:`TorchAoQuantizationConfig` (weight-only int8/int4). ``nn.Linear`` and GPT-2-style
    ``Conv1D`` layers are quantized, except the output head, tied weights, ``skip_modules`` (kept
    in ``torch_dtype``) and ``keep_in_fp32_modules``. Without ``weights_location`` a model with real
    weights is quantized from its own weights; a checkpoint saved quantized by bitsandbytes in the
    config's format (its state dict, as transformers writes it) loads as is. ``device_map`` is None (the GPU if there is one,
    else the CPU), ``"auto"``/``"balanced"``/``"sequential"`` (planned with the quantized sizes,
    within ``max_memory``) or a dict. Blocks may go to several devices, ``"cpu"`` and ``"disk"``
    (with ``offload_folder``): offloaded quantized layers keep their quantized bytes on disk (or in
    RAM) and come to the execution device (the map's first GPU, else the CPU) only for their
    forward; the rest goes through ``dispatch_model``'s offload engine.
    Raises QuantizationError, with nothing changed, when anything does not fit.
    """
    del offload_state_dict  # shards are read one at a time anyway
    config = bnb_quantization_config
    backend_for(config)  # a config no back-end knows is refused by name
    require(config.library)
    if _is_quantized_model(model):
        raise QuantizationError(
            f"{type(model).__name__} is already quantized; build a fresh model (e.g. under init_empty_weights()) "
            "and load the float checkpoint into it. Nothing was changed"
        )
    targets, _skip, fp32 = find_targets(model, config)
    if not targets:
        raise QuantizationError(
            f"{type(model).__name__} has no linear layers to quantize (nn.Linear or Conv1D outside skip_modules "
            "and keep_in_fp32_modules); bitsandbytes and torchao quantize only those. Load it without "
            "quantization (load_checkpoint_and_dispatch), or check skip_modules. Nothing was loaded"
        )
    tensors = model_tensors(model)
    _check_ties(targets, tensors)
    source = WeightSource(model, weights_location, tensors)
    saved_quantized: dict[str, tuple[str, str]] = {}  # saved name -> (layer, key in the layer)
    if prequantized.check(source.where, source.dtype, targets, source.saved_name, config):
        saved_quantized = prequantized.layer_keys(source.where, source.dtype, targets, config)
    wanted = _match(model, source, tensors, saved_quantized)
    device_map = _resolve_device_map(
        model, config, targets, fp32, device_map, max_memory, no_split_module_classes
    )
    placement = _check_placement(device_map, offload_folder, targets, config)
    offloader = None
    if placement.offloaded:
        folder = os.fspath(offload_folder) if offload_folder is not None else None
        offloader = QuantizedOffloader(placement.exec_device, config, folder)
    snap = snapshot(model)  # no copies: which tensor each module holds, to put back on a failure
    try:
        _load(model, config, targets, fp32, tensors, source, wanted, saved_quantized, placement, offloader)
        if placement.dispatched:
            _dispatch(model, placement, offloader, offload_folder, no_split_module_classes)
    except BaseException:
        if offloader is not None:
            offloader.discard()  # no quantized files left behind by a load that did not happen
        restore(model, snap)
        for t in targets:  # the original layers back in place of the quantized ones
            parent_name, _, child = t.name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, t.module)
        raise
    backend_for(config).mark_model(model, config)
    setattr(model, QUANTIZATION_ATTR, config)
    model.hf_device_map = dict(placement.device_map)
    return model


def _load(
    model, config, targets, fp32, tensors, source, wanted, saved_quantized, placement, offloader
) -> None:
    by_weight = {f"{t.name}.weight": t for t in targets}
    shells = {t.name: make_shell(t, config) for t in targets}
    values: dict[int, torch.Tensor] = {}  # id(model tensor entry) -> its new value
    parts: dict[str, dict[str, torch.Tensor]] = {}  # layer -> its saved quantized tensors
    for path in source.files:
        for saved, tensor in source.read(path, wanted, saved_quantized):
            if saved in saved_quantized:
                layer, key = saved_quantized[saved]
                parts.setdefault(layer, {})[key] = tensor.clone()
                continue
            for entry in wanted[saved]:
                target = by_weight.get(entry.names[0])
                if target is not None:
                    quantize_weight(
                        shells[target.name], tensor, target, config, placement.layer_device(target.name)
                    )
                    if target.name in placement.offloaded:  # its quantized bytes leave at once
                        offloader.offload(target.name, shells[target.name], placement.offloaded[target.name])
                    release_freed_memory()
                    continue
                dtype = tensor.dtype
                if dtype.is_floating_point:
                    dtype = torch.float32 if keeps_fp32(entry.names[0], fp32) else config.torch_dtype
                device = placement.tensor_device(entry.names[0])
                values[id(entry)] = tensor.to(device=device, dtype=dtype, copy=not source.in_memory)
            del tensor

    for layer, saved_parts in parts.items():
        prequantized.fill_layer(
            shells[layer], saved_parts, config, placement.layer_device(layer), where=f"layer {layer!r}"
        )
        if layer in placement.offloaded:
            offloader.offload(layer, shells[layer], placement.offloaded[layer])

    # every shard was read: change the model, all at once
    layer_of = {id(t.module): t.name for t in targets}
    for entry in dict.fromkeys(tensors.values()):
        value = values.pop(id(entry), None)
        if value is None:
            continue
        if isinstance(entry.tensor, nn.Parameter):  # one Parameter for every owner: ties stay tied
            value = nn.Parameter(
                value, requires_grad=entry.tensor.requires_grad and value.is_floating_point()
            )
        for owner, attr, is_param in entry.owners:
            layer = layer_of.get(id(owner))
            if layer is not None:  # the bias of a quantized layer: it moves into the new layer
                setattr(shells[layer], attr, nn.Parameter(value.detach(), requires_grad=False))
            elif is_param:
                owner._parameters[attr] = value
            else:
                owner._buffers[attr] = value
    for name, shell in shells.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, shell)


def _dispatch(model, placement, offloader, offload_folder, no_split_module_classes) -> None:
    """Run a quantized model spread over devices: the float tensors (and quantized layers' biases) of
    cpu/disk entries go through the ordinary offload engine, and so do offloaded quantized layers, in their
    quantized form (the offloader makes them units of that engine and rebuilds them for their forward)."""
    dispatch_model(
        model,
        placement.device_map,
        main_device=placement.exec_device,
        offload_dir=offload_folder,
        no_split_module_classes=no_split_module_classes,
    )
    if offloader is not None:
        offloader.attach(model._accel_nb_engine)  # one engine: shared buffers, pinned memory, prefetch order
        setattr(model, OFFLOADER_ATTR, offloader)
