"""XLA devices (TPU cores, or XLA's CPU backend): no DDP wrapper, the prepared optimizer averages gradients.

Moving a model to an XLA device makes new Parameter objects, so optimizers follow them; clipping averages
the gradients first (the norm of the averaged gradients, as with DDP); a checkpoint needs every rank
(written through collectives). accel_nb.xla does the work.

    accelerator = Accelerator()          # under PJRT_DEVICE=TPU (or CPU): accelerator.backend.name == 'xla'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import TrainingBackend, register_backend

if TYPE_CHECKING:
    import torch

__all__ = ["XlaBackend"]


@register_backend
class XlaBackend(TrainingBackend):
    """Data parallel over XLA devices (gradients all-reduced in the optimizer step, accel_nb.xla.training)."""

    name = "xla"
    launch_types = ("XLA",)

    @classmethod
    def hardware_notes(cls, cfg: Any, hw: Any, path: str | None) -> list[str]:
        if cfg.distributed_type in cls.launch_types and not hw.xla_available:
            return ["distributed_type='XLA' but torch_xla is not installed in this environment"]
        return []

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """``.to()`` makes new Parameter objects on XLA devices: optimizers must follow them."""
        from ...xla.training import parameter_slots, parameter_swap

        before = parameter_slots(model)
        model = model.to(self.accelerator.device)
        self.parameter_swap.update(parameter_swap(before))
        return model

    def after_model(self, model: torch.nn.Module) -> None:
        from ...fsdp.sharding import repoint_optimizer

        for opt in self.accelerator.prepared("optimizer"):  # optimizers prepared before the model
            repoint_optimizer(opt.optimizer, self.parameter_swap)

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        from ...fsdp.sharding import repoint_optimizer

        repoint_optimizer(
            optimizer, self.parameter_swap
        )  # the moved parameters of the models prepared before

    def before_clipping(self) -> None:
        from ...xla.training import reduce_before_clipping

        reduce_before_clipping(
            self.accelerator.prepared("optimizer")
        )  # clip the averaged gradients, as DDP does

    def needs_every_rank(self) -> str | None:
        return "XLA (the state is written through collectives)"
