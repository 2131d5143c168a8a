"""Shim at the reference's ``accelerate.utils.imports`` path: what this environment has.

    from accel_nb.utils.imports import is_transformers_available, is_bf16_available

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = dict.fromkeys(
    [
        "is_aim_available",
        "is_amdsmi_available",
        "is_4bit_bnb_available",
        "is_8bit_bnb_available",
        "is_bf16_available",
        "is_bnb_available",
        "is_bitsandbytes_multi_backend_available",
        "is_boto3_available",
        "is_clearml_available",
        "is_comet_ml_available",
        "is_cuda_available",
        "is_datasets_available",
        "is_deepspeed_available",
        "is_dvclive_available",
        "is_fp16_available",
        "is_import_timer_available",
        "is_lomo_available",
        "is_matplotlib_available",
        "is_mlflow_available",
        "is_mps_available",
        "is_msamp_available",
        "is_numpy_available",
        "is_pandas_available",
        "is_peft_available",
        "is_pippy_available",
        "is_pynvml_available",
        "is_pytest_available",
        "is_rich_available",
        "is_rocm_available",
        "is_sagemaker_available",
        "is_schedulefree_available",
        "is_swanlab_available",
        "is_tensorboard_available",
        "is_timm_available",
        "is_torch_distributed_available",
        "is_torch_xla_available",
        "is_torchao_available",
        "torchao_required",
        "is_torchdata_available",
        "is_torchdata_stateful_dataloader_available",
        "is_torchvision_available",
        "is_tqdm_available",
        "is_trackio_available",
        "is_transformers_available",
        "is_triton_available",
        "is_wandb_available",
        "is_weights_only_available",
        "is_xpu_available",
        # the reference's checks for what accel_nb has no back-end for: always False here
        "is_npu_available",
        "is_mlu_available",
        "is_musa_available",
        "is_sdaa_available",
        "is_hpu_available",
        "is_habana_gaudi1",
        "is_neuron_available",
        "is_xccl_available",
        "is_megatron_lm_available",
        "is_fp8_available",
        "is_transformer_engine_available",
        "is_transformer_engine_mxfp8_available",
    ],
    "accel_nb.availability",
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
