"""Shim at the reference's ``accelerate.utils.dataclasses`` path: option classes and enums.

    from accel_nb.utils.dataclasses import DistributedType, ProjectConfiguration

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
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
        "accel_nb.kwargs_handlers",
    ),
    **dict.fromkeys(
        ["AORecipeKwargs", "FP8BackendType", "FP8RecipeKwargs", "MSAMPRecipeKwargs", "TERecipeKwargs"],
        "accel_nb.precision.fp8_recipes",
    ),
    **dict.fromkeys(["DistributedType"], "accel_nb.state"),
    **dict.fromkeys(["ComputeEnvironment", "SageMakerDistributedType"], "accel_nb.config.values"),
    **dict.fromkeys(["DynamoBackend", "TorchDynamoPlugin"], "accel_nb.compile.options"),
    **dict.fromkeys(["LoggerType"], "accel_nb.tracking"),
    **dict.fromkeys(["RNGType"], "accel_nb.data.random_sync"),
    **dict.fromkeys(["DataLoaderConfiguration"], "accel_nb.data"),
    **dict.fromkeys(["ProjectConfiguration"], "accel_nb.checkpoint"),
    **dict.fromkeys(["FullyShardedDataParallelPlugin"], "accel_nb.fsdp"),
    **dict.fromkeys(["TensorInformation"], "accel_nb.nested"),
    **dict.fromkeys(["BnbQuantizationConfig"], "accel_nb.big_model.quantization.config"),
    **dict.fromkeys(["DeepSpeedPlugin"], "accel_nb.deepspeed"),
    **dict.fromkeys(["MegatronLMPlugin"], "accel_nb.megatron.plugin"),
    **dict.fromkeys(["TorchContextParallelConfig", "TorchTensorParallelConfig"], "accel_nb.parallel"),
    **dict.fromkeys(["CustomDtype"], "accel_nb.big_model.planning.sizes"),
    "get_module_class_from_name": "accel_nb.big_model.module_helpers",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
