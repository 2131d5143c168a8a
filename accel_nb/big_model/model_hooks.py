"""Hooks around a module's forward: run code before and after it, move inputs, bring offloaded
weights in for one call. The names and the attributes they set (``_hf_hook``, ``_old_forward``)
are those other libraries look for.

    class Scale(ModelHook):
        def post_forward(self, module, output):
            return output * 2
    add_hook_to_module(layer, Scale())          # layer(x) now returns 2 * the original output
    remove_hook_from_module(layer)              # and back

``accel_nb.dispatch_model`` keeps its own, faster offload path (it streams packed blocks); these
hooks are for code written against the hook API. A hook added on top of a dispatched module runs
around the dispatch (its ``pre_forward`` sees the inputs first).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ..ops import send_to_device
from .dispatch_hooks import restore_offloaded_weights
from .module_tensors import named_module_tensors, set_module_tensor_to_device

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "cpu_offload_with_hook",
    "iter_hooks",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]


class ModelHook:
    """Callbacks around a module's forward; subclass and override the ones you need.

    ``no_grad = True`` runs the wrapped forward under ``torch.no_grad()``.

        class Log(ModelHook):
            def pre_forward(self, module, *args, **kwargs):
                print("in", type(module).__name__)
                return args, kwargs
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module (possibly changed)."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called with the forward's inputs; returns the ``(args, kwargs)`` the forward gets."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called with the forward's output; returns what the call returns."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (``pre_forward`` first to last, ``post_forward`` too).

    add_hook_to_module(layer, SequentialHook(HookA(), HookB()))
    """

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module

    @property
    def no_grad(self) -> bool:  # type: ignore[override]
        return any(h.no_grad for h in self.hooks)


def iter_hooks(module: nn.Module) -> Iterator[ModelHook]:
    """The hooks attached to ``module`` (a SequentialHook's members one by one)."""
    stack = [getattr(module, "_hf_hook", None)]
    while stack:
        hook = stack.pop(0)
        if isinstance(hook, SequentialHook):
            stack[:0] = hook.hooks
        elif hook is not None:
            yield hook


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run ``hook`` around ``module.forward``; replaces an existing hook unless ``append=True`` chains it.

    add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    """
    if not isinstance(hook, ModelHook):
        raise TypeError(f"hook must be a ModelHook (subclass it), got {type(hook).__name__}")
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if "_old_forward" not in module.__dict__:
        module._old_forward = module.forward  # the forward in place now (the class's, or a wrapper)
    module = hook.init_hook(module)
    module._hf_hook = hook
    # a partial of the module (deepcopy maps it to the copy); __wrapped__ keeps the user's signature visible
    module.forward = functools.update_wrapper(functools.partial(_hooked_forward, module), module._old_forward)
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Undo ``add_hook_to_module`` (calling the hook's ``detach_hook``); ``recurse`` does the children too.

    remove_hook_from_module(model, recurse=True)
    """
    restore_offloaded_weights(module)
    hook = module.__dict__.get("_hf_hook")
    if hook is not None:
        hook.detach_hook(module)
    module.__dict__.pop("_hf_hook", None)
    old_forward = module.__dict__.pop("_old_forward", None)
    if old_forward is not None:
        class_forward = getattr(type(module), "forward", None)
        if (
            getattr(old_forward, "__func__", None) is class_forward
            and getattr(old_forward, "__self__", None) is module
        ):
            module.__dict__.pop("forward", None)  # back to the class's own forward
        else:
            module.forward = old_forward
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of every submodule of ``module`` (not of ``module`` itself).

    remove_hook_from_submodules(model)
    """
    for child in module.children():
        remove_hook_from_module(child)
        remove_hook_from_submodules(child)


def _first_device(obj: Any) -> torch.device | None:
    if isinstance(obj, torch.Tensor):
        return obj.device
    values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, (list, tuple)) else ()
    for item in values:
        device = _first_device(item)
        if device is not None:
            return device
    return None


def _as_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    return (
        torch.device("cuda", device)
        if isinstance(device, int) and not isinstance(device, bool)
        else torch.device(device)
    )


class AlignDevicesHook(ModelHook):
    """Put inputs and weights on ``execution_device`` for the forward; with ``offload`` keep the weights
    off the module (meta) between calls and bring them from ``weights_map`` for each call.

        add_hook_to_module(layer, AlignDevicesHook(execution_device="cuda:0", offload=True))

    ``io_same_device`` returns outputs on the inputs' device; ``offload_buffers`` offloads buffers
    too; ``place_submodules`` applies to the submodules' tensors as well; ``skip_keys`` names
    input keys left where they are; ``tied_params_map`` shares a tied weight's device copy.
    Without ``execution_device`` inputs stay where they are and, with ``offload``, each weight comes
    back for a forward to the device it was on when the hook was attached (the reference's
    forward fails there).
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    ) -> None:
        self.execution_device = _as_device(execution_device)
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.original_devices: dict[str, torch.device] = {}

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _offloaded_names(self, module: nn.Module) -> list[str]:

        names = named_module_tensors(
            module, include_buffers=self.offload_buffers, recurse=self.place_submodules
        )
        return [name for name, _ in names]

    def init_hook(self, module: nn.Module) -> nn.Module:

        tensors = dict(named_module_tensors(module, recurse=self.place_submodules))
        if not self.offload:
            if self.execution_device is not None:
                for name in tensors:
                    set_module_tensor_to_device(
                        module,
                        name,
                        self.execution_device,
                        tied_params_map=self.tied_params_map,
                        clear_cache=False,
                    )
            return module
        offloaded = self._offloaded_names(module)
        self.original_devices = {name: tensors[name].device for name in offloaded}
        if self.weights_map is None:
            self.weights_map = {name: tensors[name].detach().to("cpu") for name in offloaded}
        for name in offloaded:
            set_module_tensor_to_device(module, name, "meta", clear_cache=False)
        for name in tensors:  # what stays on the module (buffers, unless offloaded) goes to the device
            if name not in self.original_devices and self.execution_device is not None:
                set_module_tensor_to_device(module, name, self.execution_device, clear_cache=False)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:

        if self.io_same_device:
            self.input_device = _first_device((args, kwargs))
        if self.offload:
            for name in self._offloaded_names(module):
                if name not in self.weights_map:
                    raise KeyError(
                        f"AlignDevicesHook: weights_map has no entry {name!r} for this module's tensor"
                    )
                target = self.execution_device
                if target is None:  # no execution device: where the weight was when the hook was attached
                    original = self.original_devices.get(name)
                    target = original if original is not None and original.type != "meta" else "cpu"
                set_module_tensor_to_device(
                    module,
                    name,
                    target,
                    value=self.weights_map[name],
                    tied_params_map=self.tied_params_map,
                    clear_cache=False,
                )
        if self.execution_device is None:
            return args, kwargs
        return (
            send_to_device(args, self.execution_device),
            send_to_device(kwargs, self.execution_device, skip_keys=self.skip_keys),
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:

        if self.offload:
            for name in self._offloaded_names(module):
                set_module_tensor_to_device(module, name, "meta", clear_cache=False)
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:

        if self.offload:
            for name, device in self.original_devices.items():
                if device.type != "meta":
                    set_module_tensor_to_device(
                        module, name, device, value=self.weights_map.get(name), clear_cache=False
                    )
        return module


class _Prefixed(Mapping):
    """The entries of ``data`` under ``prefix``, with the prefix removed."""

    def __init__(self, data: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.data, self.prefix = data, prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.data[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        return (k[len(self.prefix) :] for k in self.data if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
) -> None:
    """An ``AlignDevicesHook`` on every submodule that holds tensors directly.

    ``weights_map`` is keyed by full names under ``module_name``; a module whose class is in
    ``preload_module_classes`` brings in all its submodules' weights at once.

        attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=model_state)
    """
    preload = set(preload_module_classes or [])
    own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
    whole = type(module).__name__ in preload
    if own or whole:
        prefix = f"{module_name}." if module_name else ""
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=execution_device,
                offload=offload,
                weights_map=_Prefixed(weights_map, prefix) if weights_map is not None else None,
                offload_buffers=offload_buffers,
                place_submodules=whole,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            ),
            append=True,
        )
    if whole:
        return
    for name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device,
            offload,
            weights_map,
            offload_buffers,
            f"{module_name}.{name}" if module_name else name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )


def _default_execution_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class CpuOffload(ModelHook):
    """Keep the model on CPU until its forward; then it moves to ``execution_device`` and stays there.

    ``prev_module_hook`` (a ``UserCpuOffloadHook``) is offloaded just before this forward.
    """

    def __init__(
        self, execution_device: Any = None, prev_module_hook: UserCpuOffloadHook | None = None
    ) -> None:
        self.execution_device = _as_device(execution_device) or _default_execution_device()
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
            from ..memory import clear_device_cache

            clear_device_cache()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` moves the model back to CPU, ``remove()`` unhooks it."""

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


def cpu_offload_with_hook(
    model: nn.Module, execution_device: Any = None, prev_module_hook: UserCpuOffloadHook | None = None
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on CPU; its forward moves it to ``execution_device``, where it stays until ``hook.offload()``.

    Chaining ``prev_module_hook`` offloads the previous model of a pipeline when this one runs:

        model_1, hook_1 = cpu_offload_with_hook(model_1, "cuda:0")
        model_2, hook_2 = cpu_offload_with_hook(model_2, "cuda:0", prev_module_hook=hook_1)
        model_2(model_1(x))   # model_1 goes back to CPU when model_2 starts
        hook_2.offload()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
