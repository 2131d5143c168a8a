"""The Accelerator's calls under DeepSpeed: setup, backward, clipping and the state dict.

The DeepSpeed back-end (``accel_nb.accelerator.backends.deepspeed``) hands the work to these functions.

    mixed_precision = precision_for(plugin, mixed_precision)   # before the AcceleratorState exists
    configure(accelerator, explicit_steps=True)                 # after it
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..env_names import ENV_MIXED_PRECISION, REFERENCE_NAMES
from .plugin import DeepSpeedPlugin

__all__ = ["precision_for", "configure", "backward", "clip_grad_norm", "engine_state_dict", "find_engine"]

CPU_FP16 = (
    "DeepSpeed's CPU accelerator has no fp16 (mixed_precision='fp16' or an enabled 'fp16' section in the "
    "DeepSpeed config); on CPU use mixed_precision='bf16' or 'no', fp16 with DeepSpeed needs GPUs"
)


def precision_for(plugin: DeepSpeedPlugin, mixed_precision: str | None) -> str:
    """The run's mixed precision agreed between the argument (or the launcher's setting) and the config."""
    if mixed_precision is None:
        env = os.environ.get(ENV_MIXED_PRECISION) or os.environ.get(REFERENCE_NAMES[ENV_MIXED_PRECISION])
        mixed_precision = env if env and env.strip().lower() != "no" else None
    return plugin.set_mixed_precision(mixed_precision.strip().lower() if mixed_precision else None)


def configure(accelerator: Any, explicit_steps: bool) -> None:
    """Mark the run DEEPSPEED and agree the accumulation steps with the config (the engine scales the loss
    and DeepSpeed's own loss scaler handles fp16, so the Accelerator keeps no GradScaler)."""
    from ..state import DistributedType
    from .preparing import agree_accumulation

    if accelerator.fsdp_options is not None:
        raise ValueError("DeepSpeed and FSDP were both asked for; choose one (deepspeed_plugin or fsdp)")
    if accelerator.device.type == "xla":
        raise ValueError("DeepSpeed does not run on XLA devices (TPU cores); use FSDP or DDP there")
    if accelerator.compile_options is not None:
        raise ValueError(
            "torch.compile with DeepSpeed is not supported by accel_nb yet; drop the compile setting"
        )
    if accelerator.device.type == "cpu" and accelerator.mixed_precision == "fp16":
        # DeepSpeed would refuse in deepspeed.initialize ("Type fp16 is not supported on your device")
        raise ValueError(CPU_FP16)
    steps = agree_accumulation(
        accelerator.deepspeed_plugin, accelerator.gradient_accumulation_steps, explicit_steps
    )
    accelerator.gradient_accumulation_steps = steps
    accelerator.scaler = None
    accelerator.state.distributed_type = DistributedType.DEEPSPEED


def backward(accelerator: Any, loss: torch.Tensor, **kwargs: Any) -> None:
    """Backward through the engine (it divides by the accumulation steps) and its step on sync steps."""
    wrapped = accelerator.deepspeed_engine_wrapped
    if wrapped is None:
        raise RuntimeError(
            "accelerator.backward() with DeepSpeed needs a prepared model: pass the model (and optimizer) to "
            "accelerator.prepare() first; DeepSpeed runs backward through its engine"
        )
    wrapped.backward(loss, sync_gradients=accelerator.sync_gradients, **kwargs)


def clip_grad_norm(accelerator: Any, max_norm: float, norm_type: float) -> float | None:
    """The engine clipped in its step with the config's ``gradient_clipping``; returns that step's norm.

    A ``max_norm`` other than the config's is an error (it would be silently ignored otherwise).
    """
    configured = (getattr(accelerator, "deepspeed_config", None) or {}).get("gradient_clipping", 0.0)
    if float(norm_type) != 2.0:
        raise ValueError(f"DeepSpeed clips by the 2-norm; norm_type={norm_type} is not supported")
    if configured and abs(float(max_norm) - float(configured)) > 1e-12:
        raise ValueError(
            f"clip_grad_norm_(max_norm={max_norm}) disagrees with the DeepSpeed config's gradient_clipping={configured}: "
            f"the engine clips inside its step; set gradient_clipping={max_norm} in DeepSpeedPlugin or the config"
        )
    if not configured:
        raise ValueError(
            f"clip_grad_norm_(max_norm={max_norm}) with DeepSpeed needs gradient_clipping={max_norm} in DeepSpeedPlugin "
            "or the config: the engine clips inside its step"
        )
    wrapped = accelerator.deepspeed_engine_wrapped
    return None if wrapped is None else wrapped.get_global_grad_norm()


def find_engine(accelerator: Any, model: Any) -> Any:
    """The prepared DeepSpeed engine that is ``model`` or holds it as ``.module``; None if there is none."""
    for engine in accelerator.prepared("model"):
        if type(engine).__name__ == "DeepSpeedEngine" and (engine is model or engine.module is model):
            return engine
    return None


def engine_state_dict(accelerator: Any, model: Any) -> dict[str, Any] | None:
    """The full weights of a DeepSpeed-prepared model (ZeRO-3 shards gathered: call it on every rank; the
    main process gets them, the others an empty dict); None when ``model`` is not a prepared engine's."""
    engine = find_engine(accelerator, model)
    if engine is None:
        return None
    if accelerator.deepspeed_plugin.zero_stage != 3:
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    gather = (
        getattr(accelerator, "deepspeed_config", None) or accelerator.deepspeed_plugin.deepspeed_config
    ).get("zero_optimization", {})
    if not gather.get("stage3_gather_16bit_weights_on_model_save"):
        raise ValueError(
            "the model is sharded with ZeRO-3 and the config does not gather it for saving; set "
            "zero3_save_16bit_model=True in DeepSpeedPlugin (stage3_gather_16bit_weights_on_model_save in the "
            "config), or save with save_state() (the engine's sharded checkpoint)"
        )
    state = engine._zero3_consolidated_16bit_state_dict()
    return {} if not state else {k: v.detach().clone() for k, v in state.items()}
