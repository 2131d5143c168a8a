"""Shim at the reference's ``accelerate.utils.bnb`` path: quantized loading with bitsandbytes.

    from accel_nb.utils.bnb import load_and_quantize_model

Nothing is defined here; each name is accel_nb's one implementation (accel_nb.big_model.quantization),
imported on first use. bitsandbytes itself is imported only when a quantized load runs.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(
        ["get_quantized_model_device_map", "load_and_quantize_model"],
        "accel_nb.big_model.quantization.loader",
    ),
    **dict.fromkeys(
        ["get_keys_to_not_convert", "has_4bit_bnb_layers", "get_parameter_device", "replace_with_bnb_layers"],
        "accel_nb.big_model.quantization.layers",
    ),
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
