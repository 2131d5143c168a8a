"""Local SGD: every process takes its own optimizer steps; the weights are averaged every K steps.

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            loss = compute_loss(model, batch)
            accelerator.backward(loss)      # no gradient all-reduce inside the block
            optimizer.step(); optimizer.zero_grad()
            local_sgd.step()                # every 8th call: average the weights over processes

It trades gradient communication on every step for a weight average every ``local_sgd_steps``.
Data parallelism only (one full copy of the model per process).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .counts import is_count
from .lazy_exports import lazy_exports
from .reexports import reexports

__all__ = ["LocalSGD"]


class LocalSGD:
    """Context manager: gradients stay local inside it; ``step()`` averages the weights every K calls.

    On leaving the block the weights are averaged once more, so every process ends with the same
    model. With one process, or ``enabled=False``, it does nothing (gradients sync as usual).

        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=4) as local_sgd:
            ...
            local_sgd.step()
    """

    def __init__(
        self, accelerator: Any, model: nn.Module, local_sgd_steps: int, enabled: bool = True
    ) -> None:
        if not is_count(local_sgd_steps):
            raise ValueError(f"local_sgd_steps={local_sgd_steps!r} must be a whole number >= 1")
        from .state import DistributedType

        distributed = accelerator.distributed_type in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
        if enabled and accelerator.num_processes > 1 and not distributed:
            raise NotImplementedError(
                f"LocalSGD averages data-parallel copies (MULTI_CPU / MULTI_GPU); this run is "
                f"{accelerator.distributed_type.value}. Pass enabled=False to train without it"
            )
        self.enabled = enabled and distributed and accelerator.num_processes > 1
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.num_steps = 0
        self._no_sync: contextlib.AbstractContextManager[Any] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.enabled:
            return
        try:
            if exc_type is None:
                self._average_weights()
        finally:
            self._no_sync.__exit__(exc_type, exc, tb)
            self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; every ``local_sgd_steps``-th call averages the weights."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average_weights()

    def _average_weights(self) -> None:
        import torch.distributed as dist

        self.accelerator.wait_for_everyone()
        world = dist.get_world_size()
        with torch.no_grad():
            for param in self.accelerator.unwrap_model(self.model).parameters():
                if not param.is_floating_point():
                    continue
                dist.all_reduce(param.data, op=dist.ReduceOp.SUM)
                param.data.div_(world)


# the names the reference's module at this path has because it imports them (accel_nb.reexports)
__getattr__, __dir__ = lazy_exports(globals(), reexports(__name__))
