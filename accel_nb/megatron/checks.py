"""What the Megatron back-end refuses, checked when the Accelerator starts (before any model is built).

Three kinds, each with the reason and what to do instead:

- settings accel_nb does not run at all (Megatron's own dataset/logging loop, encoder-decoder stage splits,
  interleaved pipelines, MoE, custom FSDP ...);
- settings only a GPU runs (bf16/fp16, the distributed optimizer, sequence parallelism, recompute,
  clipping, optimizer offload): refused on a CPU device;
- Megatron without a GPU: megatron-core calls CUDA directly (its RNG tracker, ``current_device``, tensors made
  on "cuda"), so a machine without one is refused (``require_gpu``).

    check_plugin(plugin, mixed_precision="no", device=torch.device("cuda", 0), num_processes=4)
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .plugin import EXTRA_HINT

__all__ = ["check_plugin", "require_gpu", "require_megatron_core"]

# field -> (the value that means "off", why accel_nb does not run it)
NOT_BUILT: dict[str, tuple[Any, str]] = {
    "use_custom_fsdp": (
        False,
        "Megatron's custom FSDP is not wired in accel_nb; use FSDP2 (fsdp=...) instead",
    ),
    "megatron_dataset_flag": (
        False,
        "Megatron's indexed datasets come with megatron.training (not on PyPI); pass a torch DataLoader",
    ),
    "consumed_samples": (None, "it counts samples of Megatron's indexed datasets (megatron_dataset_flag)"),
    "custom_megatron_datasets_provider_function": (None, "it builds Megatron's indexed datasets"),
    "custom_prepare_model_function": (
        None,
        "accel_nb wraps the model in Megatron's DDP itself; give custom_model_provider_function instead",
    ),
    "tensorboard_dir": (
        None,
        "megatron.training's logger is not on PyPI; use Accelerator(log_with='tensorboard')",
    ),
    "set_all_logging_options": (False, "megatron.training's logger is not on PyPI"),
    "eval_iters": (100, "only megatron.training's own loop reads it; with accel_nb the loop is yours"),
    "eval_interval": (1000, "only megatron.training's own loop reads it; with accel_nb the loop is yours"),
    "pipeline_model_parallel_split_rank": (
        None,
        "it places an encoder-decoder model's (T5's) stages; accel_nb builds T5 without pipeline stages",
    ),
    "num_layers_per_virtual_pipeline_stage": (
        None,
        "the interleaved pipeline schedule is not wired in accel_nb",
    ),
    "return_logits": (False, "the engine returns the loss only; compute logits in eval with your own model"),
    "no_wd_decay_cond": (None, "per-parameter weight decay conditions are not wired in accel_nb"),
    "scale_lr_cond": (None, "per-parameter learning-rate scaling is not wired in accel_nb"),
    "lr_mult": (1.0, "per-parameter learning-rate scaling is not wired in accel_nb"),
    "expert_model_parallel_size": (1, "mixture-of-experts models are not built by accel_nb"),
    "expert_tensor_parallel_size": (1, "mixture-of-experts models are not built by accel_nb"),
    "context_parallel_size": (1, "context parallelism needs Transformer Engine's attention (a GPU library)"),
}

# field -> the value that means "off"; any other value needs CUDA inside megatron-core
GPU_ONLY: dict[str, Any] = {
    "sequence_parallelism": False,
    "use_distributed_optimizer": False,
    "recompute_activations": False,
    "recompute_granularity": None,
    "optimizer_cpu_offload": False,
    "overlap_cpu_optimizer_d2h_h2d": False,
    "use_precision_aware_optimizer": False,
    "gradient_clipping": 0.0,
}


def require_megatron_core() -> None:
    """A clear error when megatron-core is not installed."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ImportError(f"the Megatron-LM back-end needs megatron-core: {EXTRA_HINT}")


def require_gpu(what: str) -> None:
    """A clear error when this process has no CUDA GPU: megatron-core calls CUDA directly."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs a CUDA GPU: megatron-core calls CUDA directly (its RNG tracker, current_device, "
            "tensors made on 'cuda'), and this machine has none. On CPU, train with tensor parallelism through "
            "parallelism_config=ParallelismConfig(tp_size=...) or FSDP2 instead (docs/parallelism.md)"
        )


def check_plugin(plugin: Any, mixed_precision: str, device: Any, num_processes: int) -> None:
    """Refuse what accel_nb does not run with ``plugin`` on ``device`` with ``num_processes`` processes."""
    for name, (off, why) in NOT_BUILT.items():
        value = getattr(plugin, name)
        if value != off:
            raise ValueError(f"MegatronLMPlugin({name}={value!r}) is not supported by accel_nb: {why}")
    if plugin.custom_train_step_kwargs and plugin.custom_train_step_class is None:
        raise ValueError("MegatronLMPlugin(custom_train_step_kwargs=...) needs custom_train_step_class")
    for name in ("recompute_method", "recompute_num_layers"):
        if getattr(plugin, name) is not None and plugin.recompute_granularity != "full":
            raise ValueError(f"MegatronLMPlugin({name}=...) applies to recompute_granularity='full' only")
    if plugin.recompute_granularity not in (None, "full", "selective"):
        raise ValueError(
            f"MegatronLMPlugin(recompute_granularity={plugin.recompute_granularity!r}): 'full' or 'selective'"
        )
    model_parallel = plugin.tp_degree * plugin.pp_degree
    if num_processes % model_parallel:
        raise ValueError(
            f"MegatronLMPlugin(tp_degree={plugin.tp_degree}, pp_degree={plugin.pp_degree}) needs a number of "
            f"processes divisible by {model_parallel} (tp x pp); this launch has {num_processes}"
        )
    if mixed_precision == "fp8":
        raise ValueError(
            "mixed_precision='fp8' with Megatron-LM needs Transformer Engine's layers, which accel_nb does not wire; "
            "use bf16 (GPUs) or no"
        )
    if getattr(device, "type", str(device)) == "cuda":
        return
    if mixed_precision in ("fp16", "bf16"):
        raise ValueError(
            f"mixed_precision={mixed_precision!r} with Megatron-LM runs on GPUs only (megatron-core's mixed-precision "
            "optimizer keeps fp32 main parameters on the GPU); use mixed_precision='no' on CPU"
        )
    for name, off in GPU_ONLY.items():
        value = getattr(plugin, name)
        if name == "gradient_clipping":
            value = float(value)
        if value != off:
            raise ValueError(
                f"MegatronLMPlugin({name}={value!r}) runs on GPUs only (megatron-core calls CUDA for it); on CPU "
                f"leave it at {off!r}"
            )
