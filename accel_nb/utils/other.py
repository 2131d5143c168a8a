"""Shim at the reference's ``accelerate.utils.other`` path: unwrapping, compiled regions, saving, helpers.

    from accel_nb.utils.other import extract_model_from_parallel, save

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(["extract_model_from_parallel", "is_compiled_module"], "accel_nb.accelerator.unwrap"),
    **dict.fromkeys(["compile_regions", "has_compiled_regions"], "accel_nb.compile.apply"),
    **dict.fromkeys(["wait_for_everyone"], "accel_nb.misc"),
    "get_model_tp_size": "accel_nb.parallel.tensor_parallel",
    **dict.fromkeys(
        [
            "check_os_kernel",
            "clean_state_dict_for_safetensors",
            "convert_bytes",
            "get_free_port",
            "get_pretty_name",
            "is_port_in_use",
            "load",
            "merge_dicts",
            "recursive_getattr",
            "save",
        ],
        "accel_nb.misc",
    ),
    **dict.fromkeys(
        ["get_module_children_bottom_up", "has_repeated_blocks", "is_repeated_blocks"],
        "accel_nb.big_model.module_helpers",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
