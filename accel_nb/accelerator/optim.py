"""Prepared optimizers and LR schedulers: they step only when gradients are really synchronised.

``Accelerator.prepare`` wraps them; on a sync step they behave like the optimizer/scheduler you
built, on an accumulation step ``step()`` and ``zero_grad()`` do nothing, and in fp16 the
optimizer steps through torch's GradScaler.

    optimizer = AcceleratedOptimizer(torch.optim.AdamW(model.parameters()), scaler=None)
"""

from __future__ import annotations

from typing import Any

import torch

from ..state import GradientState
from ..xla import runtime as xla_runtime

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler", "is_lr_scheduler"]


class AcceleratedOptimizer(torch.optim.Optimizer):
    """A prepared optimizer: steps only on sync steps, through the grad scaler in fp16.

    ``step_was_skipped`` is True after a step that the fp16 scaler skipped (inf/nan gradients).
    ``zero_grad`` is a no-op while gradients are being accumulated.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        """``device_placement`` (the reference's second argument) moves the optimizer's state, if it has
        any, onto the devices of its parameters (reloading it does that)."""
        # not calling super().__init__: this object forwards everything to ``optimizer``
        if device_placement and optimizer.state:
            optimizer.load_state_dict(optimizer.state_dict())
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = GradientState()
        self._is_overflow = False

    # attributes that torch code (schedulers, clip helpers) reads from an optimizer
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        """Update the parameters (only on a sync step); note whether the fp16 scaler skipped it."""
        if not self.gradient_state.sync_gradients:
            self._is_overflow = False  # nothing happened: the step belongs to a later batch
            return None
        if self.scaler is None:
            self._is_overflow = False
            if xla_runtime.in_use():  # no DDP on XLA devices: the gradients are averaged here
                from ..xla.training import optimizer_step

                return optimizer_step(self, closure)
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        scale_before = self.scaler.get_scale()
        result = (
            self.scaler.step(self.optimizer, closure)
            if closure is not None
            else self.scaler.step(self.optimizer)
        )
        self.scaler.update()
        # the scaler lowers its scale exactly when it found inf/nan gradients and skipped the step
        self._is_overflow = self.scaler.get_scale() < scale_before
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step()`` was skipped by the fp16 grad scaler (kept in ``_is_overflow``,
        the reference's attribute, which code written for it sets and reads)."""
        return self._is_overflow

    def train(self) -> None:  # schedule-free optimizers
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """A prepared LR scheduler: steps only when its optimizers really stepped.

    Each optimizer step covers ``num_processes`` batches (one per process), so the scheduler
    advances ``num_processes`` times per step -- a schedule written for a single process keeps its
    length in samples -- unless ``split_batches`` (then one batch is shared by all processes) or
    ``step_with_optimizer=False``.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_processes: int = 1,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return  # accumulating: the optimizer did not step either
        if any(opt.step_was_skipped for opt in self.optimizers):
            return  # the fp16 scaler skipped the update: the schedule waits too
        times = 1 if self.split_batches else self.num_processes
        total = getattr(self.scheduler, "total_steps", None)  # e.g. OneCycleLR refuses to go past it
        for _ in range(times):
            if total is not None and getattr(self.scheduler, "last_epoch", 0) >= total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"


def is_lr_scheduler(obj: Any) -> bool:
    """Whether ``obj`` looks like an LR scheduler (torch's or one with ``step`` and an ``optimizer``)."""
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step")
        and hasattr(obj, "optimizer")
        and isinstance(obj.optimizer, torch.optim.Optimizer)
        and not isinstance(obj, torch.optim.Optimizer)
    )
