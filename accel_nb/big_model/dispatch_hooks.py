"""Wrap a module's forward so its inputs reach its device and offloaded weights appear in time.

attach_device_hook(block, torch.device("cuda:1"))                # inputs -> cuda:1
attach_device_hook(block, torch.device("cuda:0"), unit=u, engine=e)  # offloaded block
remove_device_hooks(model)
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ..ops import send_to_device
from .offload import OffloadEngine, OffloadUnit

DISPATCH_HOOK_ATTR = "_accel_nb_hook"


class DeviceHook:
    """What a wrapped forward does: move inputs, materialise weights, optionally return outputs home."""

    def __init__(
        self,
        device: torch.device | None = None,
        units: list[OffloadUnit] | None = None,
        engine: OffloadEngine | None = None,
        io_same_device: bool = False,
        skip_keys: Any = None,
    ) -> None:
        self.device = device
        self.skip_keys = skip_keys
        self.units = list(units or [])
        self.engine = engine
        self.io_same_device = io_same_device

    def __call__(self, original_forward: Any, *args: Any, **kwargs: Any) -> Any:
        input_device = _first_device((args, kwargs)) if self.io_same_device else None
        if self.device is not None:
            args = send_to_device(args, self.device, non_blocking=True)
            kwargs = send_to_device(kwargs, self.device, non_blocking=True, skip_keys=self.skip_keys)
        entered: list[OffloadUnit] = []
        try:
            for unit in self.units:
                self.engine.before_forward(unit)
                entered.append(unit)
            output = original_forward(*args, **kwargs)
        finally:
            for unit in reversed(entered):
                self.engine.after_forward(unit)
        if input_device is not None:
            output = send_to_device(output, input_device, skip_keys=self.skip_keys)
        return output


def _first_device(obj: Any) -> torch.device | None:
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for x in obj:
            d = _first_device(x)
            if d is not None:
                return d
    return None


def attach_device_hook(
    module: nn.Module,
    device: torch.device | None = None,
    unit: OffloadUnit | None = None,
    engine: OffloadEngine | None = None,
    io_same_device: bool = False,
    skip_keys: Any = None,
) -> DeviceHook:
    """Wrap ``module.forward``; a second call on the same module merges into the existing hook."""
    hook: DeviceHook | None = getattr(module, DISPATCH_HOOK_ATTR, None)
    if hook is None:
        hook = DeviceHook(device, [], engine, io_same_device, skip_keys)
        original = module.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

        module.forward = forward  # instance attribute: nn.Module.__call__ finds it first
        setattr(module, DISPATCH_HOOK_ATTR, hook)
    else:
        hook.device = device if device is not None else hook.device
        hook.io_same_device = hook.io_same_device or io_same_device
        hook.engine = engine if engine is not None else hook.engine
        hook.skip_keys = skip_keys if skip_keys is not None else hook.skip_keys
    if unit is not None:
        hook.units.append(unit)
    return hook


def remove_device_hooks(model: nn.Module) -> None:
    """Undo :func:`attach_device_hook` on the model and all its submodules."""
    for module in model.modules():
        if getattr(module, DISPATCH_HOOK_ATTR, None) is not None:
            delattr(module, DISPATCH_HOOK_ATTR)
            if "forward" in module.__dict__:
                del module.forward


def restore_offloaded_weights(module: nn.Module) -> None:
    """Take the streaming hook off ``module`` and give it its offloaded weights back, as CPU tensors.

    What ``remove_hook_from_module`` does for a module ``cpu_offload`` / ``disk_offload`` /
    ``dispatch_model`` hooked: the weights leave the meta device (as the reference's hook removal
    does), tied weights stay one tensor, and the module's forward is its own again.
    """
    hook: DeviceHook | None = getattr(module, DISPATCH_HOOK_ATTR, None)
    if hook is None:
        return
    restored: dict[str, torch.Tensor] = {}
    for unit in hook.units:
        hook.engine.before_forward(unit)
        try:
            for slot in unit.slots:
                if slot.key not in restored:
                    live = (
                        slot.owner._parameters[slot.attr] if slot.is_param else slot.owner._buffers[slot.attr]
                    )
                    data = live.detach().to("cpu", copy=True)
                    restored[slot.key] = (
                        nn.Parameter(data, requires_grad=slot.placeholder.requires_grad)
                        if slot.is_param
                        else data
                    )
        finally:
            hook.engine.after_forward(unit)
        for slot in unit.slots:
            if slot.is_param:
                slot.owner._parameters[slot.attr] = restored[slot.key]  # type: ignore[assignment]
            else:
                slot.owner._buffers[slot.attr] = restored[slot.key]
    hook.units.clear()
    delattr(module, DISPATCH_HOOK_ATTR)
    if "forward" in module.__dict__:
        del module.forward
