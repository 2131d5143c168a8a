"""FSDP2: each prepared model sharded in place with torch's ``fully_shard`` (accel_nb.fsdp does the work).

Sharding replaces the model's parameters, so optimizers follow them (``repoint_optimizer``); the model
is never moved whole (``fully_shard`` moves each unit); gradients are partial between sync steps
(clipping waits for the sync step); a checkpoint needs every rank (each writes its shards).

    accelerator = Accelerator(fsdp=FSDPOptions())        # accelerator.backend.name == 'fsdp'
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from .base import register_backend
from .ddp import DdpBackend

if TYPE_CHECKING:
    import torch

__all__ = ["FsdpBackend"]


@register_backend
class FsdpBackend(DdpBackend):
    """Models sharded with FSDP2 (``accelerator.fsdp_options``); a DDP model prepared alongside keeps DDP's no_sync."""

    name = "fsdp"
    launch_types = ("FSDP",)
    config_key = "fsdp_config"
    inert_advice = "set distributed_type: FSDP to shard the model"

    @property
    def shards_with_fsdp(self) -> bool:  # type: ignore[override]
        return self.accelerator.fsdp_options is not None

    # -- the launch config ----------------------------------------------------------------------------
    @classmethod
    def check_launch_config(cls, cfg: Any, path: str | None) -> None:
        """``fsdp_config`` is read with ``distributed_type: FSDP``; elsewhere it warns, and so does FSDP on one process
        (the reference's files have it: the file is read, the Accelerator says what one process cannot shard)."""
        super().check_launch_config(cfg, path)
        if cfg.distributed_type not in cls.launch_types:
            return
        from ...config.values import ConfigError, warn_once  # deferred: config imports this package
        from ...fsdp.options import options_from_config

        if cfg.num_processes is not None and cfg.num_processes < 2:
            warn_once(
                "fsdp_one_process",
                f"distributed_type: FSDP with num_processes={cfg.num_processes} in {path or 'the config'} shards "
                "nothing: FSDP shards the model over several processes; set num_processes to 2 or more",
            )
        config = cfg.extras.get("fsdp_config") or {}
        if not isinstance(config, dict):
            raise ConfigError("fsdp_config", config, "a mapping of fsdp_* keys", path)
        try:
            options_from_config(config)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "fsdp_config", config, "the fsdp_* keys of docs/configuration.md", path, str(exc)
            ) from None

    @classmethod
    def launch_env(cls, cfg: Any, num_processes: int | None = None) -> dict[str, str]:
        """With ``distributed_type: FSDP``, the ``fsdp_config`` each rank's Accelerator reads (as JSON)."""
        if cfg.distributed_type not in cls.launch_types:
            return {}
        from ...env_names import ENV_FSDP_CONFIG, REFERENCE_USE_FSDP

        return {ENV_FSDP_CONFIG: json.dumps(cfg.extras.get("fsdp_config") or {}), REFERENCE_USE_FSDP: "true"}

    @classmethod
    def keeps_distributed_type(cls, several: bool) -> bool:
        return several  # sharding chosen earlier (its fsdp_config stays with it) while there are processes to shard over

    # -- prepare --------------------------------------------------------------------------------------
    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        # fully_shard moves each unit itself: never the whole model at once
        return model if self.accelerator.fsdp_options is not None else super().place(model)

    def compiles_in_place(self) -> bool:
        return self.accelerator.fsdp_options is not None

    def wrap(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Shard ``model`` in place (even in evaluation mode: sharding is about memory)."""
        acc = self.accelerator
        from ...fsdp.sharding import shard_model

        swap = shard_model(
            model,
            acc.fsdp_options,
            acc.precision.mixed_precision,
            acc.device,
            acc.num_processes,
            acc.state.num_local_processes,
        )
        self.parameter_swap.update(swap)
        return model

    def after_model(self, model: torch.nn.Module) -> None:
        super().after_model(model)
        self.repoint_optimizers()

    def repoint_optimizers(self) -> None:
        """Optimizers prepared before a model follow its new (sharded, moved) parameters."""
        from ...fsdp.sharding import repoint_optimizer

        acc = self.accelerator
        for opt in acc.prepared("optimizer"):
            repoint_optimizer(opt.optimizer, self.parameter_swap)

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point ``optimizer`` at the sharded parameters of the models prepared before it."""
        from ...fsdp.sharding import check_optimizer_params, repoint_optimizer

        acc = self.accelerator
        repoint_optimizer(optimizer, self.parameter_swap)
        if acc.fsdp_options is not None and acc.prepared("model"):
            check_optimizer_params(optimizer)

    # -- the training step ----------------------------------------------------------------------------
    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """DDP's no_sync for a DDP model; for a sharded one: no reduce-scatter, no resharding."""
        from ...fsdp.sharding import is_fsdp_model, no_gradient_sync
        from .ddp import ddp_wrapper_of

        ddp = ddp_wrapper_of(model, self.accelerator.prepared("model"))
        if ddp is not None:
            return ddp.no_sync()
        if self.accelerator.fsdp_options is not None and is_fsdp_model(model):
            return no_gradient_sync(model)
        return contextlib.nullcontext()

    # -- checkpoints ----------------------------------------------------------------------------------
    def needs_every_rank(self) -> str | None:
        return "FSDP (each process holds its shards)" if self.accelerator.fsdp_options is not None else None

    def save_parts(self, folder: str, weights: list[Any]) -> dict[int, Any]:
        """Every rank: sharded parts written with torch.distributed.checkpoint, full optimizer states gathered."""
        from ...fsdp.checkpointing import save_sharded_parts, sharded_mode

        acc = self.accelerator
        if sharded_mode(acc) is None:  # neither FSDP nor tensor parallel
            return {}
        models = [acc.unwrap_model(m, keep_torch_compile=False) for m in acc.prepared("model")]
        return save_sharded_parts(acc, folder, weights, models)

    def read_parts(self, plan: dict[str, Any]) -> None:
        """Every rank reads its shards (torch.distributed.checkpoint); all or nothing over the ranks."""
        from ...fsdp.checkpointing import read_sharded_parts, sharded_mode
        from ...ops import gather_object
        from ...serialization import CheckpointError

        if sharded_mode(self.accelerator) is None:  # neither FSDP nor tensor parallel
            return
        error = None
        try:
            read_sharded_parts(plan, [module for module, _ in plan["models"]])
        except Exception as exc:  # noqa: BLE001 - shared with the other ranks below
            error = f"{type(exc).__name__}: {exc}"
        bad = [(r, e) for r, e in enumerate(gather_object([error])) if e]
        if bad:
            raise CheckpointError(
                "load_state changed nothing: "
                + "; ".join(f"rank {r} could not read its FSDP shards: {e}" for r, e in bad)
            )
