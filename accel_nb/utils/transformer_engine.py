"""Shim at the reference's ``accelerate.utils.transformer_engine`` path: TransformerEngine's FP8 helpers.

    from accel_nb.utils.transformer_engine import has_transformer_engine_layers

Nothing is defined here; each name is accel_nb's one implementation (accel_nb.precision.fp8_te): accel_nb does
not run TransformerEngine (it needs CUDA), so the helpers that would use it refuse with the cause.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = dict.fromkeys(
    ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers"],
    "accel_nb.precision.fp8_te",
)
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
