"""DeepSpeed ZeRO: one engine for the model, its optimizer and scheduler (accel_nb.deepspeed does the work).

The engine scales the loss for accumulation and steps on sync steps (``backward``), reduces gradients only
at the boundary ``backward`` sets (so ``no_sync`` does nothing), clips by the config's
``gradient_clipping`` inside its step, and saves and loads its own sharded checkpoint.

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))   # backend.name == 'deepspeed'
"""

from __future__ import annotations

import importlib.util
import json
from typing import TYPE_CHECKING, Any

from .base import TrainingBackend, register_backend

if TYPE_CHECKING:
    import torch

__all__ = ["DeepSpeedBackend"]


@register_backend
class DeepSpeedBackend(TrainingBackend):
    """ZeRO stages 1-3 through ``deepspeed.initialize`` (``accelerator.deepspeed_plugin``)."""

    name = "deepspeed"
    launch_types = ("DEEPSPEED",)
    config_key = "deepspeed_config"
    inert_advice = "set distributed_type: DEEPSPEED to use it"
    casts_by_itself = True  # the config's fp16/bf16 sections: the engine holds half-precision weights

    # -- the launch config ----------------------------------------------------------------------------
    @classmethod
    def check_launch_config(cls, cfg: Any, path: str | None) -> None:
        """``deepspeed_config`` is read with ``distributed_type: DEEPSPEED``; elsewhere it warns."""
        super().check_launch_config(cfg, path)
        if cfg.distributed_type not in cls.launch_types:
            return
        from ...config.values import ConfigError  # deferred: config imports this package

        config = cfg.extras.get("deepspeed_config")
        if config is not None and not isinstance(config, dict):
            raise ConfigError("deepspeed_config", config, "a mapping such as {zero_stage: 2}", path)
        from ...deepspeed.plugin import (
            plugin_from_launch_settings,  # deferred: accel_nb.deepspeed imports torch
        )

        try:
            plugin_from_launch_settings(config or {})
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "deepspeed_config", config, "the keys of docs/deepspeed.md", path, str(exc)
            ) from None

    @classmethod
    def hardware_notes(cls, cfg: Any, hw: Any, path: str | None) -> list[str]:
        """DeepSpeed must be installed, and has no fp16 on CPU."""
        if cfg.distributed_type not in cls.launch_types:
            return []
        from ...config.values import ConfigError  # deferred: config imports this package

        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(
                "distributed_type",
                "DEEPSPEED",
                "a back-end installed here",
                path,
                "deepspeed is not installed; pip install 'accel_nb[deepspeed]' (DS_BUILD_OPS=0 "
                "skips compiling its ops)",
            )
        if cfg.mixed_precision == "fp16" and (cfg.use_cpu or hw.num_gpus == 0):
            raise ConfigError(
                "mixed_precision",
                "fp16",
                "bf16 or no with DeepSpeed on CPU",
                path,
                "DeepSpeed's CPU accelerator has no fp16; fp16 with DeepSpeed needs GPUs",
            )
        return []

    @classmethod
    def launch_env(cls, cfg: Any, num_processes: int | None = None) -> dict[str, str]:
        """With ``distributed_type: DEEPSPEED``, the ``deepspeed_config`` each rank's Accelerator reads (as JSON)."""
        if cfg.distributed_type not in cls.launch_types:
            return {}
        from ...env_names import ENV_DEEPSPEED_CONFIG, REFERENCE_USE_DEEPSPEED

        env = {
            ENV_DEEPSPEED_CONFIG: json.dumps(cfg.extras.get("deepspeed_config") or {}),
            REFERENCE_USE_DEEPSPEED: "true",
        }
        if cfg.use_cpu:
            env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed's CPU accelerator (gloo) in every rank
        return env

    @classmethod
    def launch_flags(cls, cfg: Any) -> list[str]:
        if cfg.distributed_type not in cls.launch_types:
            return []
        from ...config.command_line import DEEPSPEED_FLAG_KEYS  # deferred: config imports this package

        flags = ["--use_deepspeed"]
        settings = cfg.extras.get("deepspeed_config") or {}
        for key in DEEPSPEED_FLAG_KEYS:
            value = settings.get(key)
            if value is not None:
                flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
        return flags

    @classmethod
    def keeps_distributed_type(cls, several: bool) -> bool:
        return True  # chosen earlier (its deepspeed_config stays with it), one process too (ZeRO offload)

    @staticmethod
    def agree_precision(plugin: Any, mixed_precision: str | None) -> str | None:
        """Before the AcceleratorState exists: the config's fp16/bf16 and the argument agree, or an error."""
        if plugin is None:
            return mixed_precision
        from ...deepspeed.training import precision_for

        return precision_for(plugin, mixed_precision)

    # -- prepare and the step -------------------------------------------------------------------------
    def prepare(self, args: tuple[Any, ...], device_placement: list[Any]) -> list[Any]:
        """Loaders as usual, then one engine for the model, its optimizer and scheduler."""
        from ...deepspeed.preparing import prepare_deepspeed

        return prepare_deepspeed(self.accelerator, args, device_placement)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Through the engine: it divides by the accumulation steps and steps on sync steps."""
        from ...deepspeed.training import backward

        backward(self.accelerator, loss, **kwargs)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float) -> Any:
        """The engine clipped in its step (config ``gradient_clipping``): its norm is returned."""
        from ...deepspeed.training import clip_grad_norm

        return clip_grad_norm(self.accelerator, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        raise ValueError(
            "DeepSpeed clips by norm only (gradient_clipping in its config); use clip_grad_norm_"
        )

    # -- checkpoints ----------------------------------------------------------------------------------
    def needs_every_rank(self) -> str | None:
        return "DeepSpeed (each process holds its ZeRO partition)"

    def save_parts(self, folder: str, weights: list[Any]) -> dict[int, Any]:
        """Every rank: each engine saves its checkpoint; its model and optimizer are not written again."""
        from ...deepspeed.checkpointing import save_engines

        return save_engines(self.accelerator, folder, weights)

    def read_parts(self, plan: dict[str, Any]) -> None:
        """Every rank (a collective): each engine loads its checkpoint (weights, optimizer partitions, scheduler)."""
        from ...deepspeed.checkpointing import load_engines

        load_engines(self.accelerator, plan)

    def gathered_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """A prepared engine's full weights (ZeRO-3 shards gathered on the main process: every rank calls it)."""
        from ...deepspeed.training import engine_state_dict

        state = engine_state_dict(self.accelerator, model)
        return state if state is not None else super().gathered_weights(model)
