"""Load a checkpoint into a (possibly empty) model, each tensor straight to its mapped device.

    report = load_checkpoint_in_model(model, "ckpt_dir", device_map={"": "cpu"})
    report.missing_keys, report.unexpected_keys

Safetensors files are memory-mapped and read one shard at a time; each tensor is created on its
target device and dtype, so loading never holds a second full copy of the checkpoint in RAM.
Tensors mapped to ``"disk"`` are not read at all: the offload engine reads them from the
checkpoint file later (or from ``offload_folder`` when they need converting or come from pickle).
Pickle checkpoints (``.bin``/``.pt``/``.pth``) are read only with ``allow_pickle=True``, through
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..serialization import CheckpointError, CheckpointIndex, index_checkpoint, tensor_info
from .device_map import check_device_map, device_for
from .sizes import Device, as_dtype, normalize_device, torch_device

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_DISK_INDEX = "_accel_nb_disk_index"


class CheckpointLoadError(CheckpointError):
    """The checkpoint does not fit the model (missing/unexpected keys, shapes, unassigned modules)."""


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


# -- sources: safetensors (memory-mapped) or opted-in pickle --------------------------------------------
@dataclass
class _Source:
    files: list[str]
    names_in: dict[str, list[str]]  # file -> saved names
    aliases: dict[str, str]  # alias -> saved name
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    file_of: dict[str, str]
    safetensors: bool


def _pickle_index(index_file: str) -> list[str]:
    folder = os.path.dirname(index_file)
    try:
        with open(index_file, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointLoadError(
            f"{index_file} is not a valid checkpoint index ({exc}); re-save the checkpoint"
        ) from None
    return [os.path.join(folder, x) for x in dict.fromkeys(weight_map.values())]


def _pickle_files(checkpoint: str) -> list[str] | None:
    if os.path.isfile(checkpoint) and checkpoint.endswith(".index.json"):
        return None if checkpoint.endswith(".safetensors.index.json") else _pickle_index(checkpoint)
    if os.path.isfile(checkpoint):
        return [checkpoint] if checkpoint.endswith(_PICKLE_SUFFIXES) else None
    if os.path.isdir(checkpoint):
        entries = sorted(os.listdir(checkpoint))
        if any(e.endswith(".safetensors") or e.endswith(".safetensors.index.json") for e in entries):
            return None
        idx = [e for e in entries if e.endswith(".bin.index.json")]
        if idx:
            return _pickle_index(os.path.join(checkpoint, idx[0]))
        pickles = [e for e in entries if e.endswith(_PICKLE_SUFFIXES)]
        if len(pickles) == 1:
            return [os.path.join(checkpoint, pickles[0])]
    return None


def _open_source(checkpoint: str, allow_pickle: bool, weights_only: bool) -> tuple[_Source, dict[str, dict]]:
    """Index the checkpoint; pickle files are loaded (mmap) here and returned as state dicts."""
    pickles = _pickle_files(checkpoint)
    if pickles is None:
        index: CheckpointIndex = index_checkpoint(checkpoint)
        names_in: dict[str, list[str]] = defaultdict(list)
        for name, f in index.weight_map.items():
            names_in[f].append(name)
        shapes, dtypes = {}, {}
        for name in index.weight_map:
            dtypes[name], shape = tensor_info(index, name)
            shapes[name] = tuple(shape)
        return _Source(
            index.files, dict(names_in), dict(index.aliases), shapes, dtypes, dict(index.weight_map), True
        ), {}
    if not allow_pickle:
        raise CheckpointLoadError(
            f"{checkpoint} is a pickle checkpoint ({', '.join(os.path.basename(p) for p in pickles[:3])}); pickle can "
            "run code when loaded, so accel_nb reads it only when you opt in: pass allow_pickle=True (it is then "
            "read with torch.load(weights_only=True)), or convert it to safetensors"
        )
    loaded: dict[str, dict] = {}
    src = _Source(pickles, {}, {}, {}, {}, {}, False)
    for path in pickles:
        if not os.path.isfile(path):
            raise CheckpointLoadError(
                f"shard {path} named by the index is missing; copy the complete checkpoint"
            )
        try:
            sd = torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
        except Exception as exc:  # noqa: BLE001 - name the file and the way out
            raise CheckpointLoadError(
                f"cannot read {path} with torch.load(weights_only={weights_only}): {type(exc).__name__}: {exc}. "
                "If you trust the file, pass weights_only=False; better, convert it to safetensors"
            ) from None
        if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
            sd = sd["state_dict"]
        loaded[path] = sd
        src.names_in[path] = list(sd)
        for k, v in sd.items():
            src.shapes[k] = tuple(v.shape)
            src.dtypes[k] = v.dtype
            src.file_of[k] = path
    return src, loaded


# -- the load -----------------------------------------------------------------------------------------
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
    if (
        old.device.type != "meta"
        and old.device == value.device
        and old.dtype == value.dtype
        and old.shape == value.shape
    ):
        with torch.no_grad():
            old.copy_(value)
        return
    new = nn.Parameter(value, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else value
    for owner, attr, is_param in model_owners:
        if is_param:
            owner._parameters[attr] = new
        else:
            owner._buffers[attr] = new


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
    allow_pickle: bool = False,
    weights_only: bool = True,
) -> LoadReport:
    """Load a checkpoint (file, shard folder with index, or index file) into ``model``.

        with init_empty_weights():
            model = MyModel()
        report = load_checkpoint_in_model(model, "ckpt", device_map={"": "cpu"}, dtype=torch.float16)
    Everything is checked before any tensor is read: shape mismatches and (with ``strict=True``)
    missing or unexpected keys raise CheckpointLoadError naming the tensors and files. Missing keys
    for weights that are still empty (meta) always raise; otherwise they are reported and warned.
    ``offload_state_dict`` is accepted for compatibility: shards are read one at a time anyway.
    """
    del offload_state_dict
    checkpoint = os.path.abspath(os.fspath(checkpoint))
    dtype = as_dtype(dtype)
    keep_fp32 = list(keep_in_fp32_modules or [])
    if device_map is not None:
        device_map = {k: normalize_device(v) for k, v in device_map.items()}
        try:
            check_device_map(model, device_map)
        except ValueError as exc:
            raise CheckpointLoadError(str(exc)) from None
    source, pickled = _open_source(checkpoint, allow_pickle, weights_only)
    targets, non_persistent = _model_targets(model)

    # 1. match names (checkpoint aliases and model ties both count) and check shapes -- before any read
    provided: dict[str, str] = {}  # model name -> saved name
    for name in targets:
        saved = name if name in source.file_of else source.aliases.get(name)
        if saved in source.file_of:
            provided[name] = saved
    covered = {id(targets[n]) for n in provided}
    missing = [n for n, t in targets.items() if n not in provided and id(t) not in covered]
    unexpected = [
        n for n in list(source.file_of) + list(source.aliases) if n not in targets and n not in non_persistent
    ]
    mismatched = []
    for name, saved in provided.items():
        want = tuple(targets[name].tensor.shape)
        if source.shapes[saved] != want:
            mismatched.append(
                f"{name!r} is {list(source.shapes[saved])} in {os.path.basename(source.file_of[saved])}"
                f" but {list(want)} in the model"
            )
    if mismatched:
        raise CheckpointLoadError(
            f"shape mismatch between checkpoint {checkpoint} and {type(model).__name__}: {'; '.join(mismatched[:6])}"
            f"{' ...' if len(mismatched) > 6 else ''}. The checkpoint was saved from a different model configuration; "
            "build the model with the config the checkpoint was saved with"
        )
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
    if missing or unexpected:
        warnings.warn(
            f"load_checkpoint_in_model: missing keys: {_listing(missing) or 'none'}; "
            f"unexpected keys: {_listing(unexpected) or 'none'}",
            stacklevel=2,
        )

    # 2. plan: saved name -> (target, device, dtype) ; one target can be filled once
    wanted: dict[str, list[_Target]] = defaultdict(list)
    for name, saved in provided.items():
        t = targets[name]
        if t not in wanted[saved]:
            wanted[saved].append(t)

    def device_of(t: _Target) -> Device:
        if device_map is not None:
            dev = device_for(device_map, t.names[0])
            if dev == "disk" and not t.is_param and not offload_buffers:
                return "cpu"  # buffers of disk modules are kept in memory (the dispatcher moves them)
            return dev
        return "cpu" if t.tensor.device.type == "meta" else normalize_device(t.tensor.device)

    disk_index: dict[str, tuple[str, str]] = dict(getattr(model, _DISK_INDEX, {}))
    pickled_for_disk: dict[str, torch.Tensor] = {}
    report = LoadReport(missing, unexpected)

    def owners(t: _Target) -> list[tuple[nn.Module, str, bool]]:
        return t.owners

    # 3. read shard by shard, each tensor straight to its device and dtype
    for path in source.files:
        handles: dict[str, Any] = {}
        sd = None
        try:
            sd = pickled.pop(path, None)
            for saved in source.names_in.get(path, []):
                for t in wanted.get(saved, []):
                    dev = device_of(t)
                    keep = any(n == m or n.startswith(m + ".") for m in keep_fp32 for n in t.names)
                    want_dtype = _target_dtype(source.dtypes[saved], t.tensor.dtype, dtype, keep)
                    if dev == "disk":
                        if source.safetensors:
                            for n in t.names:
                                disk_index[n] = (path, saved)
                        else:
                            pickled_for_disk[t.names[0]] = sd[saved].to(want_dtype)
                        meta = torch.empty(t.tensor.shape, dtype=want_dtype, device="meta")
                        _install(owners(t), meta, t.tensor)
                        report.offloaded.append(t.names[0])
                        continue
                    device = torch_device(dev)
                    if source.safetensors:
                        key = device.type if device.type != "cuda" else f"cuda:{device.index}"
                        handle = handles.get(key)
                        if handle is None:
                            from safetensors import safe_open

                            handle = handles[key] = safe_open(path, framework="pt", device=key)
                        value = handle.get_tensor(saved)
                    else:
                        value = sd[saved]
                    if value.dtype != want_dtype:
                        value = value.to(want_dtype)
                    if value.device != device:
                        value = value.to(device)
                    if not source.safetensors and value.data_ptr() == sd[saved].data_ptr():
                        value = value.clone()  # do not keep the mmap-ed pickle storage alive
                    _install(owners(t), value, t.tensor)
                    report.loaded += 1
        finally:
            handles.clear()
            del sd
    if pickled_for_disk:
        if offload_folder is None:
            raise CheckpointLoadError(
                "the device map sends modules to 'disk' and the checkpoint is pickle, so their "
                "weights must be written out: pass offload_folder=..."
            )
        from safetensors.torch import save_file

        folder = os.fspath(offload_folder)
        os.makedirs(folder, exist_ok=True)
        out = os.path.join(
            folder,
            "accel_nb_offload_"
            + re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(checkpoint))
            + ".safetensors",
        )
        save_file({k: v.contiguous() for k, v in pickled_for_disk.items()}, out)
        for k in pickled_for_disk:
            for n in targets[k].names:
                disk_index[n] = (out, k)
    if disk_index:
        model._accel_nb_disk_index = disk_index
    return report
