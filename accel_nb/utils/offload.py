"""Shim at the reference's ``accelerate.utils.offload`` path: its offload folder format (``.dat`` + index).

    from accel_nb.utils.offload import offload_state_dict, OffloadedWeightsLoader

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_EXPORTS = dict.fromkeys(
    [
        "OffloadedWeightsLoader",
        "PrefixedDataset",
        "extract_submodules_state_dict",
        "load_offloaded_weight",
        "offload_state_dict",
        "offload_weight",
        "save_offload_index",
    ],
    "accel_nb.big_model.weight_files",
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
