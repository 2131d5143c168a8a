"""FP8 training as a model conversion: ``prepare`` turns each model's linear layers into torchao's float8 ones
before the back-end (DDP, FSDP2) and torch.compile wrap it. The recipe, the refusals and the conversion live in
``accel_nb.precision.fp8``; this module only registers it (``accelerator.fp8`` is set by the constructor).

    Accelerator(mixed_precision="fp8").conversions     # [Float8Training()]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import ModelConversion, register_conversion

if TYPE_CHECKING:
    import torch

__all__ = ["Float8Training"]


@register_conversion
class Float8Training(ModelConversion):
    """torchao's ``convert_to_float8_training`` with the run's ``AORecipeKwargs`` (``accelerator.fp8``)."""

    name = "fp8"

    @classmethod
    def applies(cls, accelerator: Any) -> bool:
        return getattr(accelerator, "fp8", None) is not None

    def convert(self, accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
        return accelerator.fp8.convert(accelerator, model)

    def __repr__(self) -> str:
        return "Float8Training()"
