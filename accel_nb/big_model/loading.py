"""Load a checkpoint into a (possibly empty) model, each tensor straight to its mapped device.

    report = load_checkpoint_in_model(model, "ckpt_dir", device_map={"": "cpu"})
    report.missing_keys, report.unexpected_keys

Safetensors files are memory-mapped and read one shard at a time; each tensor is created on its
target device and dtype, so loading never holds a second full copy of the checkpoint in RAM.
Tensors mapped to ``"disk"`` are not read at all: the offload engine reads them from the
checkpoint file later (or from ``offload_folder`` when they need converting or come from pickle).
Pickle checkpoints (``.bin``/``.pt``/``.pth``) are read as the reference reads them, through
``torch.load(weights_only=True)``: torch's restricted unpickler, which builds tensors and plain
containers and refuses any other object (so no code in the file runs). ``allow_pickle=False`` refuses
them (a service that must read safetensors only); ``weights_only=False`` is the full pickle, for files
you trust.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .checkpoint_source import CheckpointLoadError, CheckpointSource, open_source
from .planning.map_checks import check_device_map, check_devices_exist, device_for, known_entries
from .planning.sizes import Device, as_dtype, normalize_device, torch_device
from .rollback import restore, snapshot

_LOG = logging.getLogger(__name__)
_DISK_INDEX = "_accel_nb_disk_index"


@dataclass
class LoadReport:
    """What a load did: keys the model wanted but did not get, keys it did not know, where things went."""

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    loaded: int = 0
    offloaded: list[str] = field(default_factory=list)


def _listing(names: Iterable[str], limit: int = 10) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


@dataclass
class _Target:
    owner: nn.Module
    attr: str
    is_param: bool
    tensor: torch.Tensor
    names: list[str]  # every model name for this tensor (ties)
    owners: list[tuple[nn.Module, str, bool]] = field(default_factory=list)


def _model_targets(model: nn.Module) -> tuple[dict[str, _Target], set[str]]:
    """name -> target (tied names share one target); and the non-persistent buffer names."""
    by_id: dict[int, _Target] = {}
    out: dict[str, _Target] = {}
    non_persistent: set[str] = set()
    for mname, owner in model.named_modules(remove_duplicate=False):
        items = [(a, p, True) for a, p in owner._parameters.items()] + [
            (a, b, False) for a, b in owner._buffers.items()
        ]
        for attr, t, is_param in items:
            if t is None:
                continue
            name = f"{mname}.{attr}" if mname else attr
            if not is_param and attr in owner._non_persistent_buffers_set:
                non_persistent.add(name)
                continue
            target = by_id.get(id(t))
            if target is None:
                target = by_id[id(t)] = _Target(owner, attr, is_param, t, [])
            target.names.append(name)
            target.owners.append((owner, attr, is_param))
            out[name] = target
    return out, non_persistent


# -- checks, all before any tensor is read ------------------------------------------------------------
@dataclass
class _Match:
    provided: dict[str, str]  # model name -> saved name
    missing: list[str]
    unexpected: list[str]


def _match_names(targets: dict[str, _Target], non_persistent: set[str], source: CheckpointSource) -> _Match:
    """Pair model names with saved names; checkpoint aliases and model ties both count."""
    provided: dict[str, str] = {}
    for name in targets:
        saved = name if name in source.file_of else source.aliases.get(name)
        if saved in source.file_of:
            provided[name] = saved
    covered = {id(targets[n]) for n in provided}
    missing = [n for n, t in targets.items() if n not in provided and id(t) not in covered]
    unexpected = [
        n for n in list(source.file_of) + list(source.aliases) if n not in targets and n not in non_persistent
    ]
    return _Match(provided, missing, unexpected)


def _kind(dtype: torch.dtype) -> str:
    return "floating-point" if dtype.is_floating_point or dtype.is_complex else "integer/bool"


def _check_tensors(
    model: nn.Module, checkpoint: str, source: CheckpointSource, targets: dict[str, _Target], match: _Match
) -> None:
    """Every saved tensor must have the model's shape and the same kind of dtype (float vs integer)."""
    wrong_shape, wrong_kind = [], []
    for name, saved in match.provided.items():
        where = os.path.basename(source.file_of[saved])
        want = targets[name].tensor
        if source.shapes[saved] != tuple(want.shape):
            wrong_shape.append(
                f"{name!r} is {list(source.shapes[saved])} in {where} but {list(want.shape)} in the model"
            )
        elif _kind(source.dtypes[saved]) != _kind(want.dtype):
            wrong_kind.append(f"{name!r} is {source.dtypes[saved]} in {where} but {want.dtype} in the model")
    cls = type(model).__name__
    if wrong_shape:
        raise CheckpointLoadError(
            f"shape mismatch between checkpoint {checkpoint} and {cls}: {'; '.join(wrong_shape[:6])}"
            f"{' ...' if len(wrong_shape) > 6 else ''}. The checkpoint was saved from a different model configuration; "
            "build the model with the config the checkpoint was saved with"
        )
    if wrong_kind:
        raise CheckpointLoadError(
            f"dtype mismatch between checkpoint {checkpoint} and {cls}: {'; '.join(wrong_kind[:6])}"
            f"{' ...' if len(wrong_kind) > 6 else ''}. An integer tensor cannot fill a floating-point parameter "
            "(nor the reverse): the checkpoint comes from a different (e.g. quantized) model. Convert those tensors "
            "before saving (tensor.float()), or build the model the checkpoint belongs to. Nothing was loaded"
        )


def _check_keys(
    checkpoint: str, targets: dict[str, _Target], match: _Match, strict: bool, model_name: str
) -> None:
    """Missing weights of an empty model always raise; the rest raise with strict=True, else: unexpected
    keys are logged in the reference's words (code matches on them), missing keys are warned."""
    missing, unexpected = match.missing, match.unexpected
    empty_missing = [n for n in missing if targets[n].tensor.device.type == "meta"]
    if missing and (strict or empty_missing):
        raise CheckpointLoadError(
            f"checkpoint {checkpoint} is missing {len(missing)} tensor(s) the model needs: {_listing(missing)}"
            + (" (they would stay empty on the meta device)" if empty_missing else "")
            + ". Check that the checkpoint belongs to this model, or load the rest from another checkpoint first"
        )
    if unexpected and strict:
        raise CheckpointLoadError(
            f"checkpoint {checkpoint} has {len(unexpected)} tensor(s) the model does not have: {_listing(unexpected)}. "
            "Pass strict=False to ignore them, or build the model that matches the checkpoint"
        )
    if unexpected:
        _LOG.warning(
            f"Some weights of the model checkpoint at {checkpoint} were not used when initializing "
            f"{model_name}: {_listing(unexpected)}. They are left out (report.unexpected_keys); if they belong "
            "to the model, build the model that matches the checkpoint (strict=True makes this an error)"
        )
    if missing:
        warnings.warn(
            f"load_checkpoint_in_model: missing keys: {_listing(missing)} (report.missing_keys); they keep "
            "the model's current values",
            stacklevel=4,
        )


def _checked_device_map(model: nn.Module, device_map: Mapping[str, Any] | None) -> dict[str, Device] | None:
    if device_map is None:
        return None
    normalized = {k: normalize_device(v) for k, v in device_map.items()}
    try:
        check_device_map(model, normalized)
    except ValueError as exc:
        raise CheckpointLoadError(str(exc)) from None
    check_devices_exist(normalized.values(), "device_map")
    return known_entries(model, normalized)  # keys naming nothing are ignored, as by the reference


# -- reading --------------------------------------------------------------------------------------------
def _target_dtype(
    saved: torch.dtype, current: torch.dtype, dtype: torch.dtype | None, keep_fp32: bool
) -> torch.dtype:
    if not saved.is_floating_point:
        return saved
    if keep_fp32:
        return torch.float32
    if dtype is not None:
        return dtype
    return current if current.is_floating_point else saved


def _install(model_owners: list[tuple[nn.Module, str, bool]], value: torch.Tensor, old: torch.Tensor) -> None:
    """Put ``value`` where ``old`` was, in every module that holds it (ties stay tied)."""
    new = nn.Parameter(value, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else value
    for owner, attr, is_param in model_owners:
        if is_param:
            owner._parameters[attr] = new
        else:
            owner._buffers[attr] = new


def _copies_in_place(old: torch.Tensor, value: torch.Tensor) -> bool:
    """A real tensor of the same device, dtype and shape is filled in place (optimizers keep their refs)."""
    return (
        old.device.type != "meta"
        and old.device == value.device
        and old.dtype == value.dtype
        and old.shape == value.shape
    )


class _Reader:
    """Reads shard by shard, each tensor straight to its device and dtype."""

    def __init__(self, source, pickled, device_map, dtype, keep_fp32, offload_buffers, in_place) -> None:
        self.source = source
        self.pickled = pickled
        self.device_map = device_map
        self.dtype = dtype
        self.keep_fp32 = keep_fp32
        self.offload_buffers = offload_buffers
        self.in_place = in_place
        self.pickled_for_disk: dict[str, torch.Tensor] = {}
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (model tensor, value), applied last

    def device_of(self, t: _Target) -> Device:
        if self.device_map is not None:
            dev = device_for(self.device_map, t.names[0])
            if dev == "disk" and not t.is_param and not self.offload_buffers:
                return "cpu"  # buffers of disk modules are kept in memory (the dispatcher moves them)
            return dev
        return "cpu" if t.tensor.device.type == "meta" else normalize_device(t.tensor.device)

    def want_dtype(self, t: _Target, saved: str) -> torch.dtype:
        keep = any(n == m or n.startswith(m + ".") for m in self.keep_fp32 for n in t.names)
        return _target_dtype(self.source.dtypes[saved], t.tensor.dtype, self.dtype, keep)

    def read(self, wanted: dict[str, list[_Target]], report: LoadReport, disk_index: dict) -> None:
        """Fill every wanted target; disk targets only get a meta placeholder and an index entry."""
        for path in self.source.files:
            handles: dict[str, Any] = {}
            sd = self.pickled.pop(path, None)
            for saved in self.source.names_in.get(path, []):
                for t in wanted.get(saved, []):
                    dev = self.device_of(t)
                    want_dtype = self.want_dtype(t, saved)
                    if dev == "disk":
                        if self.source.safetensors:
                            disk_index.update({n: (path, saved) for n in t.names})
                        else:
                            self.pickled_for_disk[t.names[0]] = sd[saved].to(want_dtype)
                        _install(
                            t.owners, torch.empty(t.tensor.shape, dtype=want_dtype, device="meta"), t.tensor
                        )
                        report.offloaded.append(t.names[0])
                        continue
                    value = self._value(path, saved, sd, handles, torch_device(dev), want_dtype)
                    if self.in_place and _copies_in_place(t.tensor, value):
                        self.copies.append((t.tensor, value))  # applied once every shard was read
                    else:
                        _install(t.owners, value, t.tensor)
                    report.loaded += 1
            handles.clear()
            del sd

    def _value(self, path, saved, sd, handles, device: torch.device, want_dtype: torch.dtype) -> torch.Tensor:
        if self.source.safetensors:
            key = device.type if device.type != "cuda" else f"cuda:{device.index}"
            if key not in handles:
                from safetensors import safe_open

                handles[key] = safe_open(path, framework="pt", device=key)
            value = handles[key].get_tensor(saved)
        else:
            value = sd[saved]
        if value.dtype != want_dtype:
            value = value.to(want_dtype)
        if value.device != device:
            value = value.to(device)
        if not self.source.safetensors and value.data_ptr() == sd[saved].data_ptr():
            value = value.clone()  # do not keep the mmap-ed pickle storage alive
        return value

    def write_pickled_disk(
        self, offload_folder, checkpoint: str, targets: dict[str, _Target], disk_index: dict
    ) -> None:
        """Pickle weights mapped to disk are written to one safetensors file in ``offload_folder``."""
        if not self.pickled_for_disk:
            return
        from safetensors.torch import save_file

        folder = os.fspath(offload_folder)
        os.makedirs(folder, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(checkpoint))
        out = os.path.join(folder, f"accel_nb_offload_{name}.safetensors")
        save_file({k: v.contiguous() for k, v in self.pickled_for_disk.items()}, out)
        for k in self.pickled_for_disk:
            for n in targets[k].names:
                disk_index[n] = (out, k)


# -- the load -----------------------------------------------------------------------------------------
def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: Mapping[str, Any] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Iterable[str] | None = None,
    strict: bool = False,
    *,
    allow_pickle: bool = True,
    weights_only: bool = True,
) -> LoadReport:
    """Load a checkpoint (file, shard folder with index, or index file) into ``model``.

        with init_empty_weights():
            model = MyModel()
        report = load_checkpoint_in_model(model, "ckpt", device_map={"": "cpu"}, dtype=torch.float16)
    Everything is checked before any tensor is read: shape and dtype-kind mismatches, devices the
    machine lacks and (with ``strict=True``) missing or unexpected keys raise CheckpointLoadError
    (DeviceMapError for devices) naming the tensors and files. Missing keys for weights that are
    still empty (meta) always raise; otherwise they are reported and warned. If reading fails
    part-way, the model is put back as it was: tensors of a model that already has weights are
    filled in place only once every shard has been read (the new values are held until then:
    memory-mapped on the CPU, a second copy on a GPU). ``offload_state_dict`` is accepted for
    compatibility: shards are read one at a time anyway. Pickle files are read with
    ``torch.load(weights_only=weights_only)`` (torch's restricted unpickler unless ``weights_only=False``);
    ``allow_pickle=False`` refuses them.
    """
    del offload_state_dict
    return load_checkpoint_tensors(
        model,
        checkpoint,
        device_map,
        offload_folder,
        dtype,
        offload_buffers,
        keep_in_fp32_modules,
        strict,
        allow_pickle,
        weights_only,
        in_place=True,
    )


def load_checkpoint_tensors(
    model,
    checkpoint,
    device_map,
    offload_folder,
    dtype,
    offload_buffers,
    keep_in_fp32_modules,
    strict,
    allow_pickle,
    weights_only,
    in_place: bool,
) -> LoadReport:
    """The load behind load_checkpoint_in_model; ``in_place=False`` replaces tensors instead of filling them."""
    checkpoint = os.path.abspath(os.fspath(checkpoint))
    device_map = _checked_device_map(model, device_map)
    source, pickled = open_source(checkpoint, allow_pickle, weights_only)
    targets, non_persistent = _model_targets(model)
    match = _match_names(targets, non_persistent, source)
    _check_tensors(model, checkpoint, source, targets, match)
    _check_keys(checkpoint, targets, match, strict, type(model).__name__)
    reader = _Reader(
        source,
        pickled,
        device_map,
        as_dtype(dtype),
        list(keep_in_fp32_modules or []),
        offload_buffers,
        in_place,
    )
    wanted: dict[str, list[_Target]] = defaultdict(list)  # saved name -> targets (ties share one)
    for name, saved in match.provided.items():
        if targets[name] not in wanted[saved]:
            wanted[saved].append(targets[name])
    if not source.safetensors and offload_folder is None:
        to_disk = [t.names[0] for ts in wanted.values() for t in ts if reader.device_of(t) == "disk"]
        if to_disk:
            raise CheckpointLoadError(
                f"the device map sends {_listing(to_disk, 4)} to 'disk' and the checkpoint is pickle, so their "
                "weights must be written out as safetensors: pass offload_folder=... Nothing was loaded"
            )
    disk_index: dict[str, tuple[str, str]] = dict(getattr(model, _DISK_INDEX, {}))
    report = LoadReport(match.missing, match.unexpected)
    snap = snapshot(model)
    try:
        reader.read(wanted, report, disk_index)
        reader.write_pickled_disk(offload_folder, checkpoint, targets, disk_index)
    except BaseException:
        restore(model, snap)
        raise
    with torch.no_grad():
        for tensor, value in reader.copies:
            tensor.copy_(value)
    if disk_index:
        model._accel_nb_disk_index = disk_index
    return report
