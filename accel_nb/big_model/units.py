"""Which modules the dispatcher hooks and which block-sized units the offload engine streams.

Shared by the planner (to size the engine's device buffers before anything is loaded) and by
``dispatch_model`` (to build those units), so both always agree on what a unit is.

    for path, module, direct_only in offload_targets("transformer", model.transformer, ["GPT2Block"]):
        ...   # ("transformer", <GPT2Model>, True), ("transformer.wte", ..., False), ...
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .map_errors import DeviceMapError
from .sizes import is_no_split


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
