"""Shim at the reference's ``accelerate.utils.ao`` path: torchao's float8 training helpers.

    from accel_nb.utils.ao import convert_model_to_fp8_ao, has_ao_layers

Nothing is defined here; each name is accel_nb's one implementation (accel_nb.precision.fp8), imported on
first use. torchao itself is imported only when a model is converted or inspected.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = dict.fromkeys(
    [
        "convert_model_to_fp8_ao",
        "filter_first_and_last_linear_layers",
        "filter_linear_layers",
        "find_first_last_linear_layers",
        "has_ao_layers",
    ],
    "accel_nb.precision.fp8",
)
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
