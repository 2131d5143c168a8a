"""The Accelerator's gradient-synchronisation contexts for DDP beyond ``no_sync``: ``trigger_sync_in_backward``, ``join_uneven_inputs``.

Mixed into ``Accelerator``; each call has the reference library's name, arguments and meaning.

    with accelerator.trigger_sync_in_backward(model): accelerator.backward(loss)
    with accelerator.join_uneven_inputs([model], even_batches=False): ...
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .backends.ddp import sync_in_backward

__all__ = ["SyncContexts", "shard_sampler"]


def shard_sampler(loader: Any) -> Any:
    """The batch sampler that shards ``loader`` over the processes (the one with ``even_batches``), or None."""
    sampler = getattr(loader, "batch_sampler", None)
    while sampler is not None and not hasattr(sampler, "even_batches"):
        sampler = getattr(sampler, "batch_sampler", None)
    return sampler


class SyncContexts:
    """``trigger_sync_in_backward`` and ``join_uneven_inputs``."""

    _dataloaders: list[Any]

    @staticmethod
    @contextlib.contextmanager
    def trigger_sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward of a DDP model all-reduce its gradients, even after ``no_sync`` forwards.

            with accelerator.no_sync(model):
                loss_a = loss_fn(model(a))
            accelerator.backward(loss_a)                  # not synchronised
            with accelerator.trigger_sync_in_backward(model):
                accelerator.backward(loss_fn(model(b)))   # synchronised, with loss_a's gradients

        Nothing happens for a model that is not wrapped in DDP (one process).
        """
        with sync_in_backward(model):  # the DDP back-end's (accel_nb.accelerator.backends.ddp)
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[Any]:
        """torch's ``Join`` around a loop whose processes get different numbers of batches.

        ``even_batches`` overrides the Accelerator's setting for the prepared loaders inside the
        block; with even batches every process has the same count and ``Join`` is not needed
        (disabled). With one process it does nothing.

            with accelerator.join_uneven_inputs([model], even_batches=False):
                for x, y in loader:
                    accelerator.backward(loss_fn(model(x), y)); optimizer.step(); optimizer.zero_grad()
        """
        if not self.use_distributed:  # type: ignore[attr-defined]
            yield joinables
            return
        if not self.backend.joins_uneven_inputs:  # type: ignore[attr-defined]
            # FSDP, DeepSpeed, XLA: no DDP model for torch's Join to drive; nothing done, as in the reference
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU (and multi-CPU) DDP training, not "
                f"{self.distributed_type.value}: join_uneven_inputs has no effect here",  # type: ignore[attr-defined]
                UserWarning,
                stacklevel=3,
            )
            yield joinables
            return
        from torch.distributed.algorithms.join import Join, Joinable

        strangers = sorted({type(j).__name__ for j in joinables if not isinstance(j, Joinable)})
        if strangers:  # torch's Join drives DDP models only; the reference's test passes a Mock here
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU (and multi-CPU) DDP training: "
                f"{', '.join(strangers)} is not a model prepare() wrapped in DistributedDataParallel, so "
                "join_uneven_inputs has no effect here",
                UserWarning,
                stacklevel=3,
            )
            yield joinables
            return
        restore: list[tuple[Any, bool]] = []
        if even_batches is not None:
            iterable_seen = False
            for loader in self._dataloaders:
                sampler = shard_sampler(loader)
                if sampler is None:
                    iterable_seen = True
                    continue
                restore.append((sampler, sampler.even_batches))
                sampler.even_batches = even_batches
            if iterable_seen:
                warnings.warn(  # the reference's wording leads: code and tests match on it
                    "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given "
                    "were iterable: join_uneven_inputs(even_batches=...) leaves those loaders as they are",
                    UserWarning,
                    stacklevel=3,
                )
        else:
            even_batches = self.even_batches  # type: ignore[attr-defined]
        try:
            with Join(joinables, enable=not even_batches, throw_on_early_termination=False):
                yield joinables
        finally:
            for sampler, value in restore:
                sampler.even_batches = value

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Context parallel around one step's forward (and backward): with ``cp_size > 1`` each tensor
        in ``buffers`` is cut in place to this rank's share of the sequence (along its entry of
        ``buffer_seq_dims``, default 1) and attention (``scaled_dot_product_attention``) sees the whole
        sequence's keys and values; on exit the buffers are whole again, except ``no_restore_buffers``.
        Without ``cp_size > 1`` it does nothing.

            with accelerator.maybe_context_parallel(
                buffers=[input_ids, position_ids, targets], buffer_seq_dims=[1, 1, 1],
                no_restore_buffers={input_ids, position_ids, targets},
            ):
                logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
                accelerator.backward(loss)

        Pass ``position_ids`` as a buffer: the model only sees this rank's tokens and would count
        positions from 0 (accel_nb.parallel.context_parallel, docs/parallelism.md).
        """
        layout = getattr(self, "parallel_layout", None)
        if layout is None or not layout.config.cp_enabled or layout.mesh is None:
            yield
            return
        from ..parallel.context_parallel import context_parallel  # deferred: torch.distributed collectives

        with context_parallel(
            layout.config.submesh("cp").get_group(), buffers, buffer_seq_dims, no_restore_buffers
        ):
            yield
