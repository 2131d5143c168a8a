"""Shim at the reference's ``accelerate.utils.operations`` path: operations over nested tensors.

    from accel_nb.utils.operations import gather, pad_across_processes, listify

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(
        [
            "DistributedOperationException",
            "TENSOR_INT_TO_DTYPE",
            "TENSOR_TYPE_TO_INT",
            "broadcast",
            "broadcast_object_list",
            "copy_tensor_to_devices",
            "gather",
            "gather_object",
            "gather_tensor_shape",
            "pad_across_processes",
            "recursively_apply",
            "send_to_device",
        ],
        "accel_nb.ops",
    ),
    **dict.fromkeys(["reduce"], "accel_nb.misc"),
    **dict.fromkeys(
        [
            "CannotPadNestedTensorWarning",
            "ConvertOutputsToFp32",
            "concatenate",
            "convert_outputs_to_fp32",
            "convert_to_fp32",
            "find_batch_size",
            "find_device",
            "get_data_structure",
            "get_shape",
            "honor_type",
            "ignorant_find_batch_size",
            "initialize_tensors",
            "is_namedtuple",
            "is_tensor_information",
            "is_torch_tensor",
            "listify",
            "pad_input_tensors",
            "slice_tensors",
        ],
        "accel_nb.nested",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
