"""Big-model inference: build empty, plan a device map, load shards straight to devices, offload.

from accel_nb import init_empty_weights, load_checkpoint_and_dispatch
with init_empty_weights():
    model = MyModel(config)
model = load_checkpoint_and_dispatch(model, "ckpt_dir", device_map="auto",
                                     no_split_module_classes=["Block"])
"""

from .dispatch import cpu_offload, disk_offload, dispatch_model, load_checkpoint_and_dispatch, remove_dispatch
from .empty_init import init_empty_weights, init_on_device
from .loading import CheckpointLoadError, LoadReport, load_checkpoint_in_model
from .planning.device_map import (
    DeviceMap,
    DeviceMapError,
    DevicePlan,
    check_device_map,
    infer_auto_device_map,
    plan_device_map,
)
from .planning.sizes import compute_module_sizes, get_balanced_memory, get_max_memory, parse_memory

__all__ = [
    "CheckpointLoadError",
    "DeviceMap",
    "DeviceMapError",
    "DevicePlan",
    "LoadReport",
    "check_device_map",
    "compute_module_sizes",
    "cpu_offload",
    "disk_offload",
    "dispatch_model",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "parse_memory",
    "plan_device_map",
    "remove_dispatch",
]
