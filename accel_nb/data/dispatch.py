"""A data loader that only process 0 reads: it sends each process its slice of every batch.

``DataLoaderConfiguration(dispatch_batches=True)`` (the default for iterable datasets, as in the
reference library) prepares a :class:`DataLoaderDispatcher`: process 0 iterates the original
loader, joins ``num_processes`` batches into one round (or takes one batch with
``split_batches``) and scatters slice ``i`` of the round to process ``i``. Use it when the data
source can only be read once (a stream, a queue) or only on one machine.

    loader = prepare_dispatcher(DataLoader(stream, batch_size=8), device, num_processes=2, process_index=rank)
    for batch in loader:     # 8 samples per process, all read by process 0
        ...

The last, short round is completed with the first samples of the pass so every process gets a
batch of the same size; ``gather_for_metrics`` drops the copies again (``last_round_real``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..ops import broadcast_object_list
from ..xla import runtime as xla_runtime
from .loader import DataLoaderShard, loader_kwargs

__all__ = ["DataLoaderDispatcher", "prepare_dispatcher"]


def _leaf_size(batch: Any) -> int | None:
    """Samples in ``batch`` by its first tensor or list leaf; None when it has none (a string, a number)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    if isinstance(batch, dict):
        return next((n for n in map(_leaf_size, batch.values()) if n is not None), None)
    if _is_container(batch):
        return next((n for n in map(_leaf_size, batch) if n is not None), None)
    if isinstance(batch, (list, tuple)):
        return len(batch)
    return None


def _batch_size(batch: Any) -> int:
    """Samples in ``batch``: the length of its first tensor (or list) leaf; strings and numbers do not count."""
    size = _leaf_size(batch)
    if size is None:
        raise ValueError(
            f"cannot split a batch of type {type(batch).__name__} across processes: it holds no tensor or list "
            "with a batch dimension; return tensors from the dataset/collate_fn or pass dispatch_batches=False"
        )
    return size


def _is_container(batch: Any) -> bool:
    return isinstance(batch, dict) or (
        isinstance(batch, (list, tuple))
        and bool(batch)
        and isinstance(batch[0], (torch.Tensor, dict, list, tuple))
    )


def _join(batches: list[Any]) -> Any:
    """The batches' samples as one batch, leaf by leaf (tensors concatenated, lists chained)."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches) if first.dim() else first
    if isinstance(first, dict):
        return type(first)({k: _join([b[k] for b in batches]) for k in first})
    if _is_container(first):
        joined = [_join([b[i] for b in batches]) for i in range(len(first))]
        return type(first)(*joined) if hasattr(first, "_fields") else type(first)(joined)
    if not isinstance(first, (list, tuple)):  # a string or number with no batch dimension: kept as it is
        return first
    return [x for b in batches for x in b]


def _slice(batch: Any, lo: int, hi: int) -> Any:
    """Samples ``lo:hi`` of ``batch``, leaf by leaf."""
    if isinstance(batch, torch.Tensor) and batch.dim():
        return batch[lo:hi]
    if isinstance(batch, dict):
        return type(batch)({k: _slice(v, lo, hi) for k, v in batch.items()})
    if _is_container(batch):
        parts = [_slice(v, lo, hi) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)
    if isinstance(batch, (list, tuple)) or (isinstance(batch, torch.Tensor) and batch.dim()):
        return batch[lo:hi]
    return batch  # a string, number or 0-d tensor has no samples to split: every process gets it whole


class DataLoaderDispatcher(DataLoaderShard):
    """A prepared loader whose batches process 0 reads and scatters (see the module docstring).

    Like :class:`DataLoaderShard` it places batches on the device, reports ``end_of_dataloader``
    and ``last_round_real``, and takes ``set_epoch``; ``len()`` is the number of rounds.
    """

    def __init__(
        self,
        *args: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        slice_fn: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        # the reference's slice_fn_for_dispatch: slice_fn(batch, slice(lo, hi), process_index=, num_processes=)
        self.slice_fn = slice_fn
        self._last_round_real: int | None = None

    @property
    def last_round_real(self) -> int | None:
        """Real samples of the last round while it is out (the rest are copies of the first samples)."""
        return self._last_round_real if self.end_of_dataloader else None

    def begin(self) -> None:
        """Start a pass (``DataLoaderStateMixin.begin``); ``remainder`` stays -1 until the last round is out,
        then it is that round's real samples, as in the reference."""
        super().begin()
        self.remainder = -1

    def __len__(self) -> int:
        n = DataLoader.__len__(self)
        if self.split_batches:
            return n
        return n // self.num_processes if self.drop_last else math.ceil(n / self.num_processes)

    def _rounds(self) -> Iterator[Any]:
        """Process 0: the rounds of the original loader, each one batch (split) or ``num_processes`` joined."""
        it = self._base_iter()
        per_round = 1 if self.split_batches else self.num_processes
        while True:
            batches = []
            for _ in range(per_round):
                try:
                    batches.append(next(it))
                except StopIteration:
                    break
            if not batches or (len(batches) < per_round and self.drop_last):
                return
            yield _join(batches) if len(batches) > 1 else batches[0]
            if len(batches) < per_round:
                return

    def _plans(self) -> Iterator[list[Any]]:
        """Process 0: for each round, what each process gets -- ``(slice, is_last, real samples)``."""
        rounds = self._rounds()
        current = next(rounds, None)
        first = current
        while current is not None:
            upcoming = next(rounds, None)
            if (
                self.num_processes == 1
            ):  # nothing to split: the round goes whole, with a batch dimension or not
                yield [
                    (current, upcoming is None, _leaf_size(current))
                ]  # (a 0-d tensor, a number: size None)
                current = upcoming
                continue
            real = _batch_size(current)
            per = math.ceil(real / self.num_processes)
            batch = current
            if per * self.num_processes > real:  # complete the round with the pass's first samples
                pool, need = first, per * self.num_processes - real
                copies = [_slice(pool, 0, min(need, _batch_size(pool)))]
                while sum(_batch_size(c) for c in copies) < need:
                    copies.append(_slice(pool, 0, need - sum(_batch_size(c) for c in copies)))
                batch = _join([current, *copies])
            last = upcoming is None
            yield [(self._share(batch, r, per), last, real) for r in range(self.num_processes)]
            current = upcoming

    def _share(self, batch: Any, rank: int, per: int) -> Any:
        """Process ``rank``'s ``per`` samples of a round: ``slice_fn``'s choice when one was given."""
        if self.slice_fn is None:
            return _slice(batch, rank * per, (rank + 1) * per)
        part = slice(rank * per, (rank + 1) * per)
        return self.slice_fn(batch, part, process_index=rank, num_processes=self.num_processes)

    def _receive(self, plans: Iterator[list[Any]] | None) -> Any:
        """This process's ``(slice, is_last, real)`` of the next round, or None when the pass is over."""
        import torch.distributed as dist

        plan = next(plans, None) if plans is not None else None
        if self.num_processes == 1:
            return None if plan is None else plan[0]
        if xla_runtime.in_use():  # no scatter on XLA devices: each one receives the plan, keeps its part
            everyone = broadcast_object_list([plan], from_process=0)[0]
            return None if everyone is None else everyone[self.process_index]
        inbox: list[Any] = [None]
        dist.scatter_object_list(inbox, [None] * self.num_processes if plan is None else plan, src=0)
        return inbox[0]

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types:
            self._synchronize_rngs()
        self._apply_epoch()
        resume, self._resume_skip = self._resume_skip, 0
        self.batches_yielded = 0
        self._last_round_real = None
        self.begin()
        plans = self._plans() if self.process_index == 0 else None
        try:
            while True:
                mine = self._receive(plans)
                if mine is None:
                    break
                part, last, real = mine
                self.end_of_dataloader = bool(last)
                self._last_round_real = int(real) if last and real is not None else None
                if last and real is not None:
                    self.remainder = int(real)
                self.batches_yielded += 1
                if self.batches_yielded <= resume + self.skip_batches:
                    continue
                yield self._place(part)
                if last:
                    break
            self._finish_pass()
        finally:
            self.end()


def prepare_dispatcher(
    dataloader: DataLoader,
    device: torch.device | None,
    num_processes: int,
    process_index: int,
    split_batches: bool = False,
    non_blocking: bool = False,
    rng_types: list[str] | None = None,
    use_stateful_dataloader: bool = False,
    slice_fn: Any = None,
) -> DataLoaderDispatcher:
    """``dataloader`` read by process 0 only, each process getting its slice of every round
    (``slice_fn(batch, slice, process_index=, num_processes=)`` cuts it, when given).

    Example:
        loader = prepare_dispatcher(DataLoader(stream, batch_size=8), device, 2, rank)
    """
    iterable = isinstance(dataloader.dataset, torch.utils.data.IterableDataset)
    if dataloader.batch_size is None and dataloader.batch_sampler is None and not iterable:
        raise ValueError(
            "dispatch_batches=True needs a DataLoader that makes batches (batch_size is None over a map-style "
            "dataset); set batch_size or pass dispatch_batches=False"
        )
    kwargs = loader_kwargs(dataloader)
    info = {
        "num_processes": num_processes,
        "process_index": process_index,
        "split_batches": split_batches,
        "even_batches": True,
        "batch_size": dataloader.batch_size,
    }
    # batch_size=None: each item the dataset yields is one batch, split as one (the reference's way)
    if iterable:
        batching: dict[str, Any] = {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
    elif type(dataloader.batch_sampler) is torch.utils.data.BatchSampler:
        batching = {
            "batch_size": dataloader.batch_size,
            "drop_last": dataloader.drop_last,
            "sampler": dataloader.sampler,
        }
    else:
        batching = {"batch_sampler": dataloader.batch_sampler}
    return DataLoaderDispatcher(
        dataloader.dataset,
        device=device,
        non_blocking=non_blocking,
        _source=dataloader,
        _shard_info=info,
        rng_types=rng_types,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
        use_stateful_dataloader=use_stateful_dataloader,
        slice_fn=slice_fn,
        **batching,
        **kwargs,
    )
