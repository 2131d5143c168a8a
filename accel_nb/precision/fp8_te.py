"""The reference's TransformerEngine helpers, under their names: accel_nb does not run TransformerEngine.

TransformerEngine needs an NVIDIA GPU and CUDA, and accel_nb's FP8 path is torchao's (``accel_nb.precision.fp8``).
``has_transformer_engine_layers`` answers (False without the package); the others refuse with the cause.

    has_transformer_engine_layers(model)   # False: no TransformerEngine layer can exist without the package
"""

from __future__ import annotations

from typing import Any

from ..availability import is_transformer_engine_available

__all__ = ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers"]

_WHY = (
    "{name} is TransformerEngine's FP8 path, which accel_nb does not run ({cause}); train in FP8 with torchao: "
    "Accelerator(mixed_precision='fp8', kwargs_handlers=[AORecipeKwargs()]) (docs/fp8.md)"
)


def _refuse(name: str) -> None:
    cause = (
        "TransformerEngine is installed, but accel_nb's path for it is not built"
        if is_transformer_engine_available()
        else "TransformerEngine is not installed; it needs CUDA"
    )
    raise NotImplementedError(_WHY.format(name=name, cause=cause))


def has_transformer_engine_layers(model: Any) -> bool:
    """True when ``model`` holds a TransformerEngine ``Linear``, ``LayerNorm`` or ``TransformerLayer``."""
    if not is_transformer_engine_available():
        return False
    import transformer_engine.pytorch as te  # deferred: loads CUDA libraries

    kinds = (te.LayerNorm, te.Linear, te.TransformerLayer)
    return any(isinstance(module, kinds) for module in model.modules())


def convert_model(
    model: Any, to_transformer_engine: bool = True, _convert_linear: bool = True, _convert_ln: bool = True
) -> None:
    """Refused: the reference swaps layers for TransformerEngine's here."""
    _refuse("convert_model")


def apply_fp8_autowrap(model: Any, fp8_recipe_handler: Any) -> Any:
    """Refused: the reference wraps the forward in TransformerEngine's fp8_autocast here."""
    _refuse("apply_fp8_autowrap")


def contextual_fp8_autocast(model_forward: Any, fp8_recipe: Any, use_during_eval: bool = False) -> Any:
    """Refused: the reference's forward wrapper for TransformerEngine's fp8_autocast."""
    _refuse("contextual_fp8_autocast")
