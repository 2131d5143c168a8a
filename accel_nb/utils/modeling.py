"""Shim at the reference's ``accelerate.utils.modeling`` path: a model's tensors, sizes, device maps.

    from accel_nb.utils.modeling import set_module_tensor_to_device, infer_auto_device_map

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(
        [
            "find_tied_parameters",
            "load_state_dict",
            "named_module_tensors",
            "set_module_tensor_to_device",
        ],
        "accel_nb.big_model.module_tensors",
    ),
    **dict.fromkeys(
        [
            "align_module_device",
            "calculate_maximum_sizes",
            "get_state_dict_from_offload",
            "get_state_dict_offloaded_model",
            "load_offloaded_weights",
            "check_device_same",
            "check_tied_parameters_in_config",
            "check_tied_parameters_on_same_device",
            "clean_device_map",
            "compute_module_total_buffer_size",
            "convert_file_size_to_int",
            "dtype_byte_size",
            "get_max_layer_size",
            "get_module_children_bottom_up",
            "get_module_class_from_name",
            "get_module_leaves",
            "get_module_size_with_ties",
            "get_non_persistent_buffers",
            "has_offloaded_params",
            "id_tensor_storage",
            "is_peft_model",
            "retie_parameters",
        ],
        "accel_nb.big_model.module_helpers",
    ),
    **dict.fromkeys(
        [
            "check_device_map",
            "compute_module_sizes",
            "get_balanced_memory",
            "get_max_memory",
            "infer_auto_device_map",
            "load_checkpoint_in_model",
        ],
        "accel_nb.big_model",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
