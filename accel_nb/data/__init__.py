"""Data loaders shared out over processes: sharded, dispatched, resumable, shuffled alike on every rank.

    loader = prepare_data_loader(DataLoader(ds, batch_size=8, shuffle=True), num_processes=2, process_index=0)
    for batch in loader:          # this rank's batches, already on its device
        ...
    rest = skip_first_batches(loader, 10)   # same loader, first 10 batches not even loaded

The modules, one job each: ``prepare`` (``prepare_data_loader`` and ``DataLoaderConfiguration``:
which loader a DataLoader becomes), ``loader`` (``DataLoaderShard``: device placement, epochs,
resumption), ``dispatch`` (``DataLoaderDispatcher``: process 0 reads, every process gets its
slice), ``samplers`` (the sharding samplers), ``shuffling`` (the same order on every rank, saved
and restored), ``random_sync`` (generators copied from process 0), ``loader_state`` (the
reference's ``DataLoaderStateMixin`` for custom loaders).
"""

from .loader import DataLoaderShard
from .prepare import DataLoaderConfiguration, prepare_data_loader
from .samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler, SkipBatchSampler
from .skipping import SkipDataLoader, skip_first_batches

__all__ = [
    "DataLoaderConfiguration",
    "SeedableRandomSampler",
    "BatchSamplerShard",
    "SkipBatchSampler",
    "IterableDatasetShard",
    "DataLoaderShard",
    "SkipDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
]
