"""Samplers that shard the batches of a data loader over processes, reproducibly.

``SeedableRandomSampler`` gives every rank the same permutation (a function of seed and epoch),
``BatchSamplerShard`` / ``IterableDatasetShard`` hand each rank its share (evenly, with
wrap-around, or split), ``SkipBatchSampler`` drops the first batches without loading them.

    shard = BatchSamplerShard(BatchSampler(SequentialSampler(range(10)), 4, False), num_processes=2, process_index=1)
    list(shard)   # [[4, 5, 6, 7], [2, 3, 4, 5]]
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, RandomSampler, Sampler

__all__ = ["SeedableRandomSampler", "BatchSamplerShard", "SkipBatchSampler", "IterableDatasetShard"]


class SeedableRandomSampler(RandomSampler):
    """A random sampler whose order is a pure function of ``(seed, epoch)``: equal on every rank.

    The reference library's keywords work too: ``data_seed=`` is the seed, ``generator=`` is
    accepted, and without a seed it is torch's initial seed (``torch.initial_seed()``); the
    orders are the reference's for the same seed and epoch.

        sampler = SeedableRandomSampler(ds, seed=0); sampler.set_epoch(1); order = list(sampler)
    """

    def __init__(
        self,
        data_source: Any,
        seed: int | None = None,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        if data_seed is not None:
            seed = data_seed
        self.seed = int(seed if seed is not None else torch.initial_seed())
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        n = len(self.data_source)
        if self.replacement:
            yield from torch.randint(n, (self.num_samples,), dtype=torch.int64, generator=g).tolist()
            self.set_epoch(self.epoch + 1)
            return
        full, rest = divmod(self.num_samples, n)
        for _ in range(full):
            yield from torch.randperm(n, generator=g).tolist()
        if rest:
            yield from torch.randperm(n, generator=g)[:rest].tolist()
        self.set_epoch(self.epoch + 1)  # a finished pass moves on, as in the reference (a prepared loader
        # sets the epoch itself before each pass, so its orders do not depend on this)


class BatchSamplerShard(Sampler):
    """This process's share of the batches of ``batch_sampler``.

    Without ``split_batches``, rank ``i`` takes batches ``i, i+n, i+2n...``; with it, every
    batch is cut into ``n`` slices of ``batch_size / n`` and rank ``i`` takes slice ``i``. With
    ``even_batches`` the last round is completed with samples from the start of the epoch (whole
    batches when the batch sampler has no ``batch_size``, e.g. a list of index lists), so every
    rank gets the same number of batches (``gather_for_metrics`` removes the duplicates again);
    without it, ranks may get fewer or shorter batches: a short last batch of a split goes to the
    first ranks, ``batch_size / n`` samples each, as in the reference library.
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        if split_batches and self.batch_size is not None and self.batch_size % self.num_processes:
            raise ValueError(
                f"To use `BatchSamplerShard` in `split_batches` mode, the batch size ({self.batch_size}) needs "
                f"to be a round multiple of the number of processes ({self.num_processes}): split_batches=True "
                f"needs a batch size divisible by the number of processes; use a batch size of "
                f"{math.ceil(self.batch_size / self.num_processes) * self.num_processes} or split_batches=False"
            )
        if split_batches and self.batch_size is None:
            raise ValueError(
                "split_batches=True needs a batch sampler with a fixed batch_size attribute to cut each batch "
                "into equal slices; pass split_batches=False for a batch sampler without one"
            )
        #: real (not duplicated) samples in the last round over all ranks, when the last round was padded
        self.last_round_real: int | None = None

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def per_rank_batch_size(self) -> int | None:
        if self.batch_size is None:
            return None
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def _num_samples(self) -> int | None:
        s = self.sampler
        try:
            return len(s) if s is not None else None
        except TypeError:
            return None

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        n, i = self.num_processes, self.process_index
        if self.split_batches:
            if self.even_batches or total == 0:
                return total
            last = self._last_batch_len()
            return total - (1 if last is not None and last <= i * self.per_rank_batch_size else 0)
        if self.drop_last:
            return total // n
        if self.even_batches:
            return math.ceil(total / n)
        return total // n + (1 if i < total % n else 0)

    def _last_batch_len(self) -> int | None:
        m = self._num_samples()
        if m is None or self.batch_size is None:
            return None
        return m - (len(self.batch_sampler) - 1) * self.batch_size

    def expected_last_round_real(self) -> int | None:
        """Real samples of the last round over all ranks when ``even_batches`` pads it, else None."""
        m = self._num_samples()
        if m is None or not self.even_batches or self.batch_size is None or self.drop_last:
            return None
        round_size = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        rest = m % round_size
        return rest if rest else None

    def __iter__(self) -> Iterator[list[int]]:
        self.last_round_real = None
        if self.split_batches:
            yield from self._iter_split()
        else:
            yield from self._iter_rounds()

    def _fill(self, indices: list[int], size: int, start: list[int]) -> list[int]:
        """Complete ``indices`` to ``size`` with indices from the start of the epoch (cycled)."""
        out = list(indices)
        pool = start if start else indices
        k = 0
        while len(out) < size and pool:
            out.append(pool[k % len(pool)])
            k += 1
        return out

    def _iter_split(self) -> Iterator[list[int]]:
        i, part = self.process_index, self.per_rank_batch_size
        first: list[int] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            if not first:
                first = batch[:]
            if self.even_batches and len(batch) < self.batch_size:
                self.last_round_real = len(batch)
                batch = self._fill(batch, self.batch_size, first)
            piece = batch[i * part : (i + 1) * part]
            if piece:  # without even_batches a short last batch may leave nothing for this rank
                yield piece

    def _iter_rounds(self) -> Iterator[list[int]]:
        n, i = self.num_processes, self.process_index
        first: list[int] = []  # the first round's indices, used to complete the last round
        first_batches: list[list[int]] = []  # ... or its batches, when they have no fixed size
        round_: list[list[int]] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            round_.append(batch)
            if len(first) < (self.batch_size or 0) * n:
                first.extend(batch)
            if len(first_batches) < n:
                first_batches.append(batch)
            if len(round_) == n and (self.batch_size is None or len(batch) == self.batch_size):
                yield round_[i]
                round_ = []
        if not round_:
            return
        if self.drop_last:  # only full batches exist; an incomplete round is dropped on every rank
            return
        if not self.even_batches:
            if i < len(round_):
                yield round_[i]
            return
        if self.batch_size is None:  # batches of any size: complete the round with the first batches
            self.last_round_real = sum(len(b) for b in round_)
            copies = [first_batches[k % len(first_batches)] for k in range(n - len(round_))]
            yield (round_ + copies)[i]
            return
        # even_batches: the last round is laid out contiguously and completed from the start of the
        # epoch, so that gathering it in rank order gives the real samples first, then the copies.
        real = [x for b in round_ for x in b]
        self.last_round_real = len(real)
        filled = self._fill(real, self.batch_size * n, first)
        yield filled[i * self.batch_size : (i + 1) * self.batch_size]


class SkipBatchSampler(Sampler):
    """``batch_sampler`` without its first ``skip_batches`` batches (indices only: nothing is loaded)."""

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = int(skip_batches)

    @property
    def batch_size(self) -> int | None:
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        for k, batch in enumerate(self.batch_sampler):
            if k >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)


class IterableDatasetShard(IterableDataset):
    """This process's share of an iterable dataset, read in rounds of ``batch_size * num_processes``.

    Rank ``i`` keeps slice ``i`` of every round (``split_batches`` means ``batch_size`` is the
    whole round). The last, incomplete round is completed with the first samples
    (``even_batches``) or dropped (``drop_last``) so every rank yields the same number of samples.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        if split_batches and batch_size % num_processes:
            raise ValueError(
                f"To use `IterableDatasetShard` in `split_batches` mode, the batch size ({batch_size}) needs to "
                f"be a round multiple of the number of processes ({num_processes}): split_batches=True needs a "
                "batch size divisible by the number of processes"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.epoch = 0
        self.last_round_real: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.last_round_real = None
        per_rank = self.batch_size // self.num_processes if self.split_batches else self.batch_size
        round_size = per_rank * self.num_processes
        lo, hi = self.process_index * per_rank, (self.process_index + 1) * per_rank
        first: list[Any] | None = None
        buf: list[Any] = []
        for item in self.dataset:
            buf.append(item)
            if len(buf) == round_size:
                if first is None:
                    first = buf[:]
                yield from buf[lo:hi]
                buf = []
        if buf and not self.drop_last:
            if not self.even_batches:
                yield from buf[lo:hi]
                return
            self.last_round_real = len(buf)
            pool = first if first is not None else buf[:]
            k = 0
            while len(buf) < round_size:
                buf.append(pool[k % len(pool)])
                k += 1
            yield from buf[lo:hi]
