"""Shim at the reference's ``accelerate.utils`` path; the code lives in the core modules it names.

Nothing is defined here: every name resolves on first use from its one implementation, and each
of the reference's submodule paths is a shim here too (``accel_nb.utils.operations``,
``accel_nb.utils.modeling``, ...). accel_nb's own small helpers that used to live here
(``human_bytes``, ``parse_size``, ``imported_module``, ``in_ipython_kernel``) still resolve here.

    from accel_nb.utils import set_seed, gather, find_executable_batch_size
    from accel_nb.utils.operations import pad_across_processes
"""

from __future__ import annotations

import importlib

from ..lazy_exports import lazy_exports

# The reference library's ``utils`` module path: each name is the one implementation elsewhere in
# accel_nb, imported on first use (``import accel_nb.utils`` stays light).
_REFERENCE_PATHS: dict[str, str] = {
    **dict.fromkeys(["set_seed", "wait_for_everyone", "reduce"], "..misc"),
    # accel_nb's own helpers, at the path they had before they moved to the core
    **dict.fromkeys(["human_bytes", "parse_size"], "..byte_sizes"),
    **dict.fromkeys(["imported_module", "in_ipython_kernel"], "..availability"),
    **dict.fromkeys(["DistributedType", "PartialState", "AcceleratorState", "GradientState"], "..state"),
    **dict.fromkeys(
        [
            "gather",
            "gather_object",
            "broadcast",
            "broadcast_object_list",
            "pad_across_processes",
            "send_to_device",
            "recursively_apply",
            "copy_tensor_to_devices",
        ],
        "..ops",
    ),
    "ProjectConfiguration": "..checkpoint",
    "DataLoaderConfiguration": "..data",
    **dict.fromkeys(
        [
            "AutocastKwargs",
            "DDPCommunicationHookType",
            "DistributedDataParallelKwargs",
            "GradScalerKwargs",
            "GradientAccumulationPlugin",
            "InitProcessGroupKwargs",
            "KwargsHandler",
            "ProfileKwargs",
        ],
        "..kwargs_handlers",
    ),
    **dict.fromkeys(
        ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"],
        "..memory",
    ),
    **dict.fromkeys(["patch_environment", "clear_environment"], "..environment"),
    "write_basic_config": "..config.basic",
    **dict.fromkeys(["FSDPOptions", "FullyShardedDataParallelPlugin"], "..fsdp"),
    **dict.fromkeys(
        ["ParallelismConfig", "TorchTensorParallelConfig", "TorchContextParallelConfig"], "..parallel"
    ),
    "LoggerType": "..tracking",
    **dict.fromkeys(["RNGType", "synchronize_rng_state", "synchronize_rng_states"], "..data.random_sync"),
    **dict.fromkeys(["extract_model_from_parallel", "is_compiled_module"], "..accelerator.unwrap"),
    **dict.fromkeys(["TorchDynamoPlugin", "DynamoBackend"], "..compile.options"),
    **dict.fromkeys(["compile_regions", "has_compiled_regions"], "..compile.apply"),
    **dict.fromkeys(
        [
            "find_tied_parameters",
            "load_state_dict",
            "named_module_tensors",
            "set_module_tensor_to_device",
        ],
        "..big_model.module_tensors",
    ),
    "get_state_dict_offloaded_model": "..big_model.module_helpers",
    # Megatron-LM on megatron-core (docs/megatron.md); the reference's other Megatron names are left out
    **dict.fromkeys(["MegatronLMPlugin", "MegatronLMDummyScheduler"], "..megatron.plugin"),
    **dict.fromkeys(
        ["avg_losses_across_data_parallel_group", "gather_across_data_parallel_groups"], "..megatron.helpers"
    ),
    **dict.fromkeys(
        ["MegatronEngine", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper"], "..megatron.engine"
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
        "..big_model",
    ),
}


# the reference's submodules of ``utils``: each a shim module here; their names resolve from this
# package too (``accel_nb.utils.listify``), as in the reference
_SHIMS = (
    "ao",
    "bnb",
    "constants",
    "dataclasses",
    "deepspeed",
    "environment",
    "imports",
    "launch",
    "memory",
    "modeling",
    "offload",
    "operations",
    "other",
    "random",
    "tqdm",
    "transformer_engine",
    "versions",
)
for _shim in _SHIMS:
    for _name in importlib.import_module(f".{_shim}", __name__).__all__:
        _REFERENCE_PATHS.setdefault(_name, f".{_shim}")
del _shim, _name
# as in the reference, ``accel_nb.utils.tqdm`` is the function; its module stays importable by its path
del globals()["tqdm"]

__getattr__, __dir__ = lazy_exports(globals(), _REFERENCE_PATHS)
