"""Checks of a device map someone gives: does it cover the model, name real modules, name devices this
machine has; and which entry a tensor falls under.

    check_device_map(model, {"transformer": 0, "lm_head": "cpu"})   # DeviceMapError if a tensor is left out
    device_for({"transformer": 0, "": "cpu"}, "transformer.h.0.attn.c_attn.weight")   # 0
    check_devices_exist(device_map.values(), "device_map")   # before anything is loaded or moved
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .map_errors import DeviceMapError
from .sizes import Device, device_name, named_tensors, normalize_device

__all__ = ["check_device_map", "check_devices_exist", "device_for", "known_entries"]


def device_for(device_map: Mapping[str, Device], name: str) -> Device | None:
    """The device of a tensor or module path: the entry with the longest matching prefix."""
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in device_map:
            return device_map[key]
    return None


def _tensor_and_module_names(model: nn.Module) -> set[str]:
    return (
        set(dict(model.named_modules()))
        | {n for n, _ in model.named_parameters()}
        | {n for n, _ in model.named_buffers()}
    )


def known_entries(model: nn.Module, device_map: Mapping[str, Device]) -> dict[str, Device]:
    """``device_map`` without the entries that name nothing in ``model`` (check_device_map warned about them).

    known_entries(model, {"": 0, "lm_haed": "cpu"})   # {"": 0}
    """
    names = _tensor_and_module_names(model)
    return {k: v for k, v in device_map.items() if k in names}


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise DeviceMapError naming the modules no entry covers; warn (as the reference) about entries
    naming nothing: a misspelt key leaves its module where another entry puts it."""
    names = _tensor_and_module_names(model)
    unknown = [k for k in device_map if k not in names]
    if unknown:
        warnings.warn(  # the reference's words first: code and tests match on them
            f"The following device_map keys do not match any submodules in the model: {unknown}; they are not "
            f"modules or tensors of {type(model).__name__} and are ignored, so a misspelt key leaves its module "
            "where another entry puts it (module paths look like 'transformer.h.0')",
            UserWarning,
            stacklevel=2,
        )
    uncovered = [n for n, _ in named_tensors(model) if device_for(device_map, n) is None]
    if uncovered:
        # report the outermost modules whose tensors are all unassigned (else the tensors themselves)
        missing = set(uncovered)
        all_names = [n for n, _ in named_tensors(model)]
        top: list[str] = []
        for mname, _ in model.named_modules():
            inside = [n for n in all_names if mname == "" or n.startswith(mname + ".")]
            if not inside or not all(n in missing for n in inside):
                continue
            if any(mname == t or mname.startswith(t + ".") for t in top):
                continue
            top.append(mname)
        covered_by_top = {n for n in missing if any(n.startswith(t + ".") for t in top)}
        top += [n for n in uncovered if n not in covered_by_top]
        raise DeviceMapError(
            f"the device map leaves {len(uncovered)} tensor(s) unassigned, in: {', '.join(top[:12])}"
            f"{' ...' if len(top) > 12 else ''}. Add these modules to the map (e.g. {top[0]!r}: 'cpu') "
            "or use device_map='auto'."
        )


def check_devices_exist(devices: Iterable[Any], source: str) -> None:
    """Raise DeviceMapError naming any GPU in ``source`` (e.g. "max_memory") this machine lacks.

        check_devices_exist(device_map.values(), "device_map")
    Called before anything is loaded or moved. Planning alone never calls it: maps for a GPU
    machine can be made on a laptop.
    """
    wanted = {normalize_device(d) for d in devices}
    gpus = sorted(d for d in wanted if isinstance(d, int))
    have = torch.cuda.device_count() if gpus and torch.cuda.is_available() else 0
    missing = [g for g in gpus if g >= have]
    if missing:
        names = ", ".join(device_name(g) for g in missing)
        machine = f"{have} CUDA GPU(s)" if have else "no CUDA GPU"
        raise DeviceMapError(
            f"{source} names {names} but this machine has {machine}; nothing was loaded. Remove the GPU "
            f"entries from {source} (e.g. {{'cpu': '30GiB', 'disk': '1TB'}}), or run on a machine with "
            "that GPU. Planning alone (infer_auto_device_map, show_device_map) works without it."
        )
    if "mps" in wanted and not torch.backends.mps.is_available():
        raise DeviceMapError(f"{source} names 'mps' but MPS is not available here; nothing was loaded")
