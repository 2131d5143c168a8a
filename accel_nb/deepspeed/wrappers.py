"""What ``prepare`` returns under DeepSpeed, and the stand-ins for a config-defined optimizer/scheduler.

The engine does the work: ``backward`` scales the loss for accumulation and, on a sync step,
reduces, clips, steps the optimizer and the scheduler and zeroes the gradients. So the prepared
optimizer's ``step``/``zero_grad`` and the scheduler's ``step`` do nothing (a training loop
written for DDP runs unchanged).

    optimizer = DummyOptim(model.parameters(), lr=1e-3)        # the config's "optimizer" section
    scheduler = DummyScheduler(optimizer, total_num_steps=100)  # the config's "scheduler" section
"""

from __future__ import annotations

from typing import Any

from ..accelerator.optim import AcceleratedOptimizer, AcceleratedScheduler

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
]


class DeepSpeedEngineWrapper:
    """Drives a ``DeepSpeedEngine`` from ``Accelerator.backward``: backward always, step on sync steps.

    Example:
        wrapped = DeepSpeedEngineWrapper(engine); wrapped.backward(loss, sync_gradients=True)
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        # the accumulation boundary follows the Accelerator (it also syncs at the end of a loader)
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()  # reduce, clip (config), optimizer and scheduler step, zero_grad

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last sync step (before clipping), as a number; None before the first."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The prepared optimizer: the engine steps and zeroes it, so ``step``/``zero_grad`` do nothing.

    ``step_was_skipped`` is True after an fp16 step DeepSpeed's loss scaler skipped (overflow).
    """

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, scaler=None)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing: the engine zeroes the gradients after its step."""

    def step(self, closure: Any = None) -> None:
        """Nothing: ``accelerator.backward`` stepped the engine on the sync step."""

    @property
    def step_was_skipped(self) -> bool:
        return bool(getattr(self.optimizer, "overflow", False))

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizerWrapper({type(self.optimizer).__name__})"


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The prepared scheduler: the engine steps it after each optimizer step, so ``step`` does nothing."""

    def __init__(self, scheduler: Any, optimizers: list[Any]) -> None:
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine stepped the scheduler with the optimizer."""


class DummyOptim:
    """Stands for the optimizer of the DeepSpeed config's ``"optimizer"`` section in ``prepare``.

    ``lr`` and ``weight_decay`` fill the section's ``"auto"`` values.

        optimizer = DummyOptim(model.parameters(), lr=3e-4)
    """

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the DeepSpeed config's ``"scheduler"`` section (or ``lr_scheduler_callable(optimizer)``).

    ``total_num_steps`` and ``warmup_num_steps`` fill the section's ``"auto"`` values.

        scheduler = DummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Any = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
