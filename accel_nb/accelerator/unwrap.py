"""Get the user's model back out of DDP, DataParallel, torch.compile and the autocast forward.

model = extract_model_from_parallel(prepared_model)
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from ..nested import ConvertOutputsToFp32

__all__ = ["extract_model_from_parallel", "is_compiled_module", "strip_parallel"]

# the attribute accel_nb's precision policy keeps the user's forward under while autocast wraps it
_ORIGINAL_FORWARD = "_accel_nb_original_forward"


def is_compiled_module(module: object) -> bool:
    """True for what ``torch.compile(module)`` returns."""
    compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    compiled_type = getattr(compiled, "OptimizedModule", None)
    return compiled_type is not None and isinstance(module, compiled_type)


def _is_parallel(module: object) -> bool:
    # accel_nb.deepspeed: the engine holds the model as .module
    if type(module).__name__ == "DeepSpeedEngine":
        return True
    return isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel))


def strip_parallel(model: nn.Module) -> nn.Module:
    """The model inside every DDP / DataParallel / DeepSpeed wrapper around ``model`` (not inside torch.compile)."""
    while _is_parallel(model):
        model = model.module
    return model


def _set_forward(model: nn.Module, forward: Any) -> None:
    if getattr(forward, "__func__", None) is getattr(type(model), "forward", None):
        model.__dict__.pop("forward", None)  # back to the class's own forward
    else:
        model.forward = forward


def _fp32_converter(forward: Any) -> ConvertOutputsToFp32 | None:
    """The converter behind a forward that ``convert_outputs_to_fp32`` made (maybe bound to the model), else None."""
    wrapped = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
    if isinstance(forward, ConvertOutputsToFp32):
        return forward
    return wrapped if isinstance(wrapped, ConvertOutputsToFp32) else None


def _remove_autocast_forward(model: nn.Module) -> None:
    original = model.__dict__.pop(_ORIGINAL_FORWARD, None)
    if original is not None:
        _set_forward(model, original)
    # a forward wrapped by hand (model.forward = convert_outputs_to_fp32(model.forward)): its converter
    # holds the forward it wraps; a function of the class (bound by MethodType) is bound to the model again
    while (converter := _fp32_converter(model.__dict__.get("forward"))) is not None:
        inner = converter.model_forward
        if (
            getattr(inner, "__self__", None) is None
            and getattr(model.__dict__["forward"], "__self__", None) is model
        ):
            inner = types.MethodType(inner, model)
        _set_forward(model, inner)


def _strip_children(model: nn.Module) -> None:
    for name, child in list(model.named_children()):
        inner = strip_parallel(child)
        if inner is not child:
            setattr(model, name, inner)
        _strip_children(inner)


def extract_model_from_parallel(
    model: nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> nn.Module:
    """The model inside its distributed wrappers.

    ``keep_fp32_wrapper=False`` also removes the mixed-precision forward ``prepare`` installed, and a
    forward wrapped by ``convert_outputs_to_fp32`` (so the model pickles again);
    ``keep_torch_compile=True`` returns the compiled module (now around the unwrapped model) when
    the model was compiled, ``False`` the plain module; ``recursive=True`` also unwraps wrapped
    submodules.

        plain = extract_model_from_parallel(ddp_model)
    """
    compiled = None
    if is_compiled_module(model):
        compiled, model = model, model._orig_mod
    model = strip_parallel(model)
    if is_compiled_module(model):  # DDP around a compiled module
        compiled, model = model, strip_parallel(model._orig_mod)
    if not keep_fp32_wrapper:
        _remove_autocast_forward(model)
    if recursive:
        _strip_children(model)
    if compiled is not None and keep_torch_compile:
        if compiled._orig_mod is model:
            return compiled
        # a compiled view of the unwrapped model with the same settings: the prepared model keeps
        # its DDP wrapper (re-pointing its _orig_mod would detach its parameters from the wrapper)
        return type(compiled)(model, compiled.dynamo_ctx)
    return model
