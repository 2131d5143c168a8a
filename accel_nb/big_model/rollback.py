"""Put a model back exactly as it was when loading or dispatching fails part-way.

Example:
    snap = snapshot(model)
    try:
        ...                      # load tensors, move them, hook forwards
    except BaseException:
        restore(model, snap)     # same tensor objects, same data, no hooks, no engine
        raise
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .dispatch_hooks import remove_device_hooks

_MODEL_ATTRS = ("hf_device_map", "_accel_nb_engine", "_accel_nb_disk_index")
_ABSENT = object()


@dataclass
class ModelSnapshot:
    """Every tensor slot of a model (with the tensor's data at the time) and its dispatch attributes."""

    slots: list[tuple[nn.Module, str, bool, torch.Tensor, torch.Tensor]]
    attrs: dict[str, Any]


def snapshot(model: nn.Module) -> ModelSnapshot:
    """Remember which tensor each module holds (and what data it points at); costs no copy."""
    slots = []
    for module in model.modules():
        for attr, t in module._parameters.items():
            if t is not None:
                slots.append((module, attr, True, t, t.data))
        for attr, t in module._buffers.items():
            if t is not None:
                slots.append((module, attr, False, t, t.data))
    attrs = {name: model.__dict__.get(name, _ABSENT) for name in _MODEL_ATTRS}
    return ModelSnapshot(slots, attrs)


def restore(model: nn.Module, snap: ModelSnapshot) -> None:
    """Undo loads, moves, placeholders and hooks made since :func:`snapshot`."""
    remove_device_hooks(model)
    engine = model.__dict__.get("_accel_nb_engine")
    if engine is not None and engine is not snap.attrs["_accel_nb_engine"]:
        engine.close()
    with torch.no_grad():
        for module, attr, is_param, tensor, data in snap.slots:
            tensor.data = data  # undoes `param.data = param.data.to(device)` moves
            (module._parameters if is_param else module._buffers)[attr] = tensor
    for name, value in snap.attrs.items():
        if value is _ABSENT:
            model.__dict__.pop(name, None)
        else:
            model.__dict__[name] = value
