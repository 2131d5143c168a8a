"""Skipping a loader's first batches: ``skip_first_batches`` and ``SkipDataLoader`` (resuming mid-epoch).

Map-style datasets skip by index (``SkipBatchSampler``), so the skipped samples are never loaded; a
prepared loader that ``load_state`` put in the middle of a pass resumes that very pass.

    for batch in skip_first_batches(train_loader, resume_step):
        ...
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from .loader import DataLoaderShard, loader_kwargs, require_torchdata
from .samplers import SkipBatchSampler
from .shuffling import PassShuffle

__all__ = ["SkipDataLoader", "skip_first_batches"]


def _resumed_pass(dataloader: DataLoaderShard) -> DataLoaderShard:
    """A loader for the rest of the pass that ``load_state`` put ``dataloader`` in the middle of.

    Its pass is the one the interrupted run was in (same shuffle, same RNG draws), so resuming with
    ``skip_first_batches(loader, resume_step)`` gives the batches the uninterrupted run saw, as
    iterating ``loader`` itself does; ``dataloader``'s next pass is the next epoch.
    """
    inner = dataloader.unskipped_batch_sampler()
    new = DataLoaderShard.__new__(DataLoaderShard)
    DataLoaderShard.__init__(
        new,
        dataloader.dataset,
        device=dataloader.device,
        non_blocking=dataloader.non_blocking,
        _source=dataloader._source,
        _shard_info=dataloader._shard_info,
        rng_types=dataloader.rng_types,
        synchronized_generator=dataloader.synchronized_generator,
        use_stateful_dataloader=dataloader.use_stateful_dataloader,
        batch_sampler=SkipBatchSampler(inner, dataloader.skip_batches),
        _own_skipper=True,
        **loader_kwargs(dataloader),
    )
    new.skip_batches = dataloader.skip_batches
    new.epoch = dataloader.epoch
    new.batches_yielded = dataloader.batches_yielded
    new._resume_skip = dataloader.batches_yielded - dataloader.skip_batches
    new._shuffle, dataloader._shuffle = dataloader._shuffle, PassShuffle()
    dataloader.epoch += 1
    dataloader.batches_yielded = 0
    return new


class SkipDataLoader(DataLoaderShard):
    """A ``DataLoader`` whose every pass leaves out its first ``skip_batches`` batches (they are still loaded).

    Example:
        loader = SkipDataLoader(dataset, skip_batches=3, batch_size=8)   # prefer skip_first_batches
    """

    def __init__(
        self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any
    ) -> None:
        if use_stateful_dataloader:
            require_torchdata()
        super().__init__(
            dataset,
            device=None,
            skip_batches=skip_batches,
            use_stateful_dataloader=use_stateful_dataloader,
            **kwargs,
        )

    def __len__(self) -> int:
        # the batches of a whole pass, counted without the index skipper (which may hold skip_batches
        # already), less the skipped ones
        skipper = self._index_skipper
        whole = len(skipper.batch_sampler) if skipper is not None and self._auto_collation else None
        if whole is None:
            whole = DataLoader.__len__(self)
        return max(whole - self.skip_batches, 0)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader like ``dataloader`` whose passes start after the first ``num_batches`` batches.

    Map-style datasets skip by index, so the skipped samples are never loaded.

        for batch in skip_first_batches(train_loader, resume_step):
            ...
    """
    num_batches = int(num_batches)
    if num_batches < 0:
        raise ValueError(f"num_batches={num_batches} must be >= 0")
    if isinstance(dataloader, DataLoaderShard):
        # The reference's resume pattern: load_state, then skip_first_batches(loader, resume_step) for the
        # resumed epoch. The explicit skip stands for the position load_state restored, which must not be
        # applied again to the loader's next pass (a later epoch would lose its first batches).
        pending, dataloader._resume_skip = dataloader._resume_skip, 0
        if pending and pending == num_batches and not isinstance(dataloader.dataset, IterableDataset):
            return _resumed_pass(dataloader)
        new = DataLoaderShard.__new__(DataLoaderShard)
        kwargs = loader_kwargs(dataloader)
        if isinstance(dataloader.dataset, IterableDataset):
            DataLoaderShard.__init__(
                new,
                dataloader.dataset,
                device=dataloader.device,
                non_blocking=dataloader.non_blocking,
                skip_batches=num_batches,
                _source=dataloader._source,
                _shard_info=dataloader._shard_info,
                rng_types=dataloader.rng_types,
                use_stateful_dataloader=dataloader.use_stateful_dataloader,
                batch_size=dataloader.batch_size,
                drop_last=dataloader.drop_last,
                **kwargs,
            )
        else:
            inner = dataloader.unskipped_batch_sampler()
            DataLoaderShard.__init__(
                new,
                dataloader.dataset,
                device=dataloader.device,
                non_blocking=dataloader.non_blocking,
                skip_batches=num_batches,
                _source=dataloader._source,
                _shard_info=dataloader._shard_info,
                rng_types=dataloader.rng_types,
                synchronized_generator=dataloader.synchronized_generator,
                use_stateful_dataloader=dataloader.use_stateful_dataloader,
                batch_sampler=SkipBatchSampler(inner, num_batches),
                _own_skipper=True,
                **kwargs,
            )
        new.epoch = dataloader.epoch
        return new
    kwargs = loader_kwargs(dataloader)
    if isinstance(dataloader.dataset, IterableDataset) or dataloader.batch_sampler is None:
        return DataLoaderShard(
            dataloader.dataset,
            device=None,
            skip_batches=num_batches,
            _source=dataloader,
            batch_size=dataloader.batch_size,
            drop_last=dataloader.drop_last,
            **kwargs,
        )
    return DataLoader(
        dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **kwargs
    )
