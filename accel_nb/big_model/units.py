"""Which modules the dispatcher hooks and which block-sized units the offload engine streams.

Shared by the planner (to size the engine's device buffers before anything is loaded) and by
``dispatch_model`` (to build those units), so both always agree on what a unit is; ``build_unit``
takes a module's (or one tensor's) weights off it into the ``OffloadUnit`` the engine streams.

    for path, module, direct_only in offload_targets("transformer", model.transformer, ["GPT2Block"]):
        ...   # ("transformer", <GPT2Model>, True), ("transformer.wte", ..., False), ...
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import torch
from torch import nn

from .offload import OffloadUnit, TensorSlot
from .planning.map_errors import DeviceMapError
from .planning.sizes import is_no_split

DISK_INDEX = "_accel_nb_disk_index"  # set by load_checkpoint_in_model: {tensor name: (file, key)}


def tensor_slots(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module, str, bool, torch.Tensor]]:
    """(full name, owner module, attribute, is_param, tensor) for every tensor, ties included."""
    for mname, owner in module.named_modules(prefix=prefix, remove_duplicate=False):
        for attr, p in owner._parameters.items():
            if p is not None:
                yield (f"{mname}.{attr}" if mname else attr), owner, attr, True, p
        for attr, b in owner._buffers.items():
            if b is not None:
                yield (f"{mname}.{attr}" if mname else attr), owner, attr, False, b


def is_container(module: nn.Module) -> bool:
    """Modules whose forward is never called (ModuleList, ModuleDict): hook their children."""
    return type(module).forward is nn.Module.forward


def hook_targets(name: str, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules whose forward runs for a map entry: itself, or a container's children."""
    if not is_container(module):
        return [(name, module)]
    if module._parameters or module._buffers:
        raise DeviceMapError(
            f"{name!r} ({type(module).__name__}) holds tensors but has no forward; "
            "assign its parent module to one device instead"
        )
    out: list[tuple[str, nn.Module]] = []
    for child_name, child in module.named_children():
        out += hook_targets(f"{name}.{child_name}" if name else child_name, child)
    return out


def offload_targets(
    name: str, module: nn.Module, no_split: list[str | type]
) -> list[tuple[str, nn.Module, bool]]:
    """Streaming units of an offloaded entry: (path, module, own tensors only?).

    A unit is a no-split block or a module without tensor-holding children; bigger entries are
    split, so the execution device never needs room for more than ``num_buffers`` such units.
    """
    if is_container(module):
        out: list[tuple[str, nn.Module, bool]] = []
        for child_name, child in hook_targets(name, module):
            out += offload_targets(child_name, child, no_split)
        return out
    children = [(f"{name}.{c}" if name else c, m) for c, m in module.named_children()]
    if is_no_split(module, no_split) or not any(next(tensor_slots(m, n), None) for n, m in children):
        return [(name, module, False)]
    out = [(name, module, True)]
    for child_name, child in children:
        out += offload_targets(child_name, child, no_split)
    return out


# -- building a unit: a module's (or one tensor's) weights taken off it into an OffloadUnit -----------------
def not_loaded_error(name: str) -> DeviceMapError:
    return DeviceMapError(
        f"{name!r} is still on the meta device (no weights). Load them first: "
        "load_checkpoint_and_dispatch(model, checkpoint, device_map=...) or load_checkpoint_in_model(...)"
    )


def move_tensor(owner: nn.Module, attr: str, is_param: bool, name: str, device: torch.device) -> None:
    t = owner._parameters[attr] if is_param else owner._buffers[attr]
    if t.device == device:
        return
    if t.device.type == "meta":
        raise not_loaded_error(name)
    if is_param:
        try:
            t.data = t.data.to(device)  # keeps the Parameter object (and so any tie) intact
        except RuntimeError:
            owner._parameters[attr] = nn.Parameter(t.data.to(device), requires_grad=t.requires_grad)
    else:
        owner._buffers[attr] = t.to(device)


def save_for_disk(tensors: dict[str, torch.Tensor], offload_dir: str | None, tag: str) -> str:
    """Write in-memory weights that must live on disk as one safetensors file; return its path."""
    if offload_dir is None:
        raise DeviceMapError(
            "the device map sends modules to 'disk' but no offload folder was given; "
            "pass offload_dir=... (dispatch_model) or offload_folder=... (load_checkpoint_and_dispatch)"
        )
    from safetensors.torch import save_file

    os.makedirs(offload_dir, exist_ok=True)
    path = os.path.join(
        offload_dir, "accel_nb_offload_" + re.sub(r"[^A-Za-z0-9_.-]", "_", tag or "model") + ".safetensors"
    )
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, path)
    return path


def build_unit(
    model: nn.Module,
    name: str,
    module: nn.Module,
    owner_attr: str | None,
    source: str,
    exec_device: torch.device,
    offload_buffers: bool,
    offload_dir: str | None,
    placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]],
    direct_only: bool = False,
) -> OffloadUnit | None:
    """Take a module's (or one tensor's) weights off the module into an OffloadUnit."""
    disk_index: dict[str, tuple[str, str]] = getattr(model, DISK_INDEX, {})
    unit = OffloadUnit(name, module, source)
    if owner_attr is None and direct_only:
        prefix = f"{name}." if name else ""
        entries = [(prefix + a, module, a, True, p) for a, p in module._parameters.items() if p is not None]
        entries += [(prefix + a, module, a, False, b) for a, b in module._buffers.items() if b is not None]
    elif owner_attr is None:
        entries = list(tensor_slots(module, name))
    else:
        is_param = owner_attr in module._parameters
        t = module._parameters[owner_attr] if is_param else module._buffers[owner_attr]
        entries = [(name, module, owner_attr, is_param, t)]
    to_write: dict[str, torch.Tensor] = {}
    first_name: dict[int, str] = {}
    for full, owner, attr, is_param, t in entries:
        if not is_param and not offload_buffers:
            if t.device.type == "meta" and full in disk_index:
                path, key = disk_index[full]
                from safetensors import safe_open

                with safe_open(path, framework="pt", device="cpu") as f:
                    owner._buffers[attr] = f.get_tensor(key).to(t.dtype).to(exec_device)
            else:
                move_tensor(owner, attr, False, full, exec_device)
            continue
        key = first_name.setdefault(id(t), full)
        if source == "disk" and key in disk_index:
            unit.disk[key] = disk_index[key]
        elif t.device.type != "meta":
            if source == "cpu":
                unit.host[key] = t.detach().to("cpu")
            else:
                to_write[key] = t.detach()
        elif key in disk_index:  # cpu source, weights were sent to disk by the loader: read them in
            from safetensors import safe_open

            path, k = disk_index[key]
            with safe_open(path, framework="pt", device="cpu") as f:
                unit.host[key] = f.get_tensor(k).to(t.dtype)
        else:
            raise not_loaded_error(full)
        # keyed by id: the original tensor is kept in the value so no id is reused during a dispatch
        holder = placeholders[id(t)][1] if id(t) in placeholders else None
        if holder is None:
            meta = t.detach().to("meta")
            holder = nn.Parameter(meta, requires_grad=t.requires_grad) if is_param else meta
            placeholders[id(t)] = (t, holder)
        unit.slots.append(TensorSlot(owner, attr, is_param, key, t.dtype, t.shape, holder))
    if to_write:
        path = save_for_disk(to_write, offload_dir, name)
        for key in to_write:
            unit.disk[key] = (path, key)
    if not unit.slots:
        return None
    for s in unit.slots:
        if s.is_param:
            s.owner._parameters[s.attr] = s.placeholder  # type: ignore[assignment]
        else:
            s.owner._buffers[s.attr] = s.placeholder
    return unit
