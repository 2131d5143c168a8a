"""Keep layer weights in a small storage dtype (e.g. float8) and cast each layer up only for its forward.

    attach_layerwise_casting_hooks(model, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16,
                                   skip_modules_pattern=["norm"])
    model(x)      # each Linear / Conv runs in bfloat16, then goes back to float8

Memory for weights shrinks to the storage dtype's size, at the price of the rounding it causes.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from .model_hooks import ModelHook, add_hook_to_module

__all__ = ["LayerwiseCastingHook", "attach_layerwise_casting_hooks"]

# the layers whose weights are cast (the reference's list): matrix products and convolutions
CASTABLE_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = CASTABLE_LAYERS  # the reference's name for the same tuple


class LayerwiseCastingHook(ModelHook):
    """Module in ``storage_dtype`` between forwards, in ``compute_dtype`` during one."""

    def __init__(
        self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool = False
    ) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | list[str] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Hook every Linear / Conv / ConvTranspose layer of ``module`` (``module`` itself if it is one) so its
    weights are stored in ``storage_dtype`` and computed in ``compute_dtype``.

    A layer whose dotted name matches one of ``skip_modules_pattern`` (``re.search``) or whose class
    is in ``skip_modules_classes`` is left alone, with everything under it. A single string is one
    pattern (the reference reads a string character by character).
    """
    patterns = (
        (skip_modules_pattern,)
        if isinstance(skip_modules_pattern, str)
        else tuple(skip_modules_pattern or ())
    )
    classes = tuple(skip_modules_classes or ())

    def visit(current: nn.Module, name: str) -> None:
        if (classes and isinstance(current, classes)) or any(re.search(p, name) for p in patterns):
            return
        if isinstance(current, CASTABLE_LAYERS):
            add_hook_to_module(
                current, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True
            )
            return
        for child_name, child in current.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name)

    visit(module, "")
