"""The TP/CP/PP layout: the processes on a device mesh (``ParallelismConfig``), accel_nb.parallel does the work.

Models are split with their tensor-parallel plan and sharded with FSDP2 over the mesh's data-parallel
shard dimension (a layout with neither trains with DDP over the replicas); loaders split the data over
the data-parallel ranks only; gradient norms are reduced over every mesh a gradient lives on.

    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    accelerator.backend.name                               # 'layout'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import register_backend
from .ddp import DdpBackend
from .fsdp import FsdpBackend

if TYPE_CHECKING:
    import torch

__all__ = ["LayoutBackend"]

LAYOUT_KEY = "parallelism_config"  # the launch config's section


@register_backend
class LayoutBackend(FsdpBackend):
    """Tensor/context/pipeline parallel with FSDP2 on one device mesh (``accelerator.parallelism_config``)."""

    name = "layout"
    launch_types = ()  # any distributed_type: the launch config's parallelism_config section chooses it
    config_key = None

    # -- the launch config ----------------------------------------------------------------------------
    @classmethod
    def check_launch_config(cls, cfg: Any, path: str | None) -> None:
        """The layout's sizes are checked against ``num_processes`` (docs/parallelism.md)."""
        if not cfg.extras.get(LAYOUT_KEY):
            return
        from ...config.values import ConfigError  # deferred: config imports this package
        from ...parallel.config import check_launch_settings

        try:
            cfg.extras[LAYOUT_KEY] = check_launch_settings(cfg.extras[LAYOUT_KEY], cfg.num_processes)
        except ValueError as exc:
            raise ConfigError(
                LAYOUT_KEY, cfg.extras[LAYOUT_KEY], "docs/parallelism.md", path, str(exc)
            ) from None

    @classmethod
    def launch_env(cls, cfg: Any, num_processes: int | None = None) -> dict[str, str]:
        """The saved layout as the environment each rank's Accelerator builds its ``ParallelismConfig`` from."""
        layout = cfg.extras.get(LAYOUT_KEY)
        if not layout:
            return {}
        from ...config.values import ConfigError  # deferred: config imports this package
        from ...parallel.config import check_launch_settings, launch_env

        n = num_processes if num_processes is not None else cfg.num_processes
        try:
            settings = check_launch_settings(layout, n)
        except ValueError as exc:
            raise ConfigError(LAYOUT_KEY, layout, "docs/parallelism.md", cfg.source, str(exc)) from None
        return launch_env(settings)

    @classmethod
    def launch_flags(cls, cfg: Any) -> list[str]:
        layout = cfg.extras.get(LAYOUT_KEY) or {}
        if not layout:
            return []
        flags = ["--use_parallelism_config"]
        for key, value in layout.items():
            if value is not None:
                flags += [f"--{key}", str(value)]
        return flags

    # -- prepare --------------------------------------------------------------------------------------
    @property
    def layout(self) -> Any:
        return self.accelerator.parallel_layout

    def by_layout(self) -> bool:
        """Whether the layout splits or shards models (else: DDP over the replicas)."""
        return self.layout.tp_enabled or self.layout.fsdp is not None

    def compiles_in_place(self) -> bool:
        return self.accelerator.fsdp_options is not None or self.by_layout()

    def wrap(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """Split ``model`` with its tensor-parallel plan and shard it over the mesh; DDP when the layout does neither."""
        if not self.by_layout():
            return DdpBackend.wrap(self, model, evaluation_mode)
        from ...parallel.preparing import parallelize  # deferred: torch.distributed.tensor

        acc = self.accelerator
        self.parameter_swap.update(parallelize(model, self.layout, acc.precision.mixed_precision, acc.device))
        return model

    def data_shards(self) -> tuple[int, int]:
        """The ranks of one tensor/context-parallel group read the same batches."""
        return self.layout.data_parallel_size, self.layout.data_parallel_rank

    def check_dispatch(self, dispatch_batches: Any) -> None:
        if self.layout.data_parallel_size != self.accelerator.num_processes and dispatch_batches:
            raise ValueError(
                "dispatch_batches=True with tensor/context parallel is not supported: process 0 would send each "
                "process its own slice; leave dispatch_batches unset (every data-parallel rank reads its shard)"
            )

    # -- the training step ----------------------------------------------------------------------------
    def clip_norm(self, parameters: Any, max_norm: float, norm_type: float) -> Any:
        """Parameters on several meshes (tp, dp_shard x tp) and plain ones: one global norm."""
        from ...parallel.clipping import clip_grad_norm_across_meshes

        return clip_grad_norm_across_meshes(parameters, max_norm, norm_type)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool) -> Any:
        """The ranks of one tensor/context-parallel group read one batch: it is gathered once per group."""
        acc = self.accelerator
        groups = self.layout.config.non_data_parallel_size
        if groups <= 1:
            return super().gather_for_metrics(input_data, use_gather_object)
        from ...parallel.metrics import gather_once_per_group

        return gather_once_per_group(
            input_data, use_gather_object, acc.gradient_state, groups, acc.num_processes
        )

    # -- checkpoints ----------------------------------------------------------------------------------
    def needs_every_rank(self) -> str | None:
        from ...fsdp.checkpointing import sharded_mode

        held = super().needs_every_rank()
        if held is None and sharded_mode(self.accelerator) is not None:
            return "tensor parallelism (each process holds its slices)"
        return held
