"""The reference library's ``data_loader`` module path: accel_nb's sharded loaders and samplers.

    from accel_nb.data_loader import BatchSamplerShard, prepare_data_loader, skip_first_batches

Nothing is defined here; each name is the one implementation in ``accel_nb.data``,
``accel_nb.data_dispatch``, ``accel_nb.samplers`` or ``accel_nb.loader_state``, imported on first use.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports

_EXPORTS = {
    "DataLoaderShard": "accel_nb.data",
    "DataLoaderStateMixin": "accel_nb.loader_state",
    "DataLoaderDispatcher": "accel_nb.data_dispatch",
    "SkipDataLoader": "accel_nb.data",
    "prepare_data_loader": "accel_nb.data",
    "skip_first_batches": "accel_nb.data",
    "BatchSamplerShard": "accel_nb.samplers",
    "IterableDatasetShard": "accel_nb.samplers",
    "SeedableRandomSampler": "accel_nb.samplers",
    "SkipBatchSampler": "accel_nb.samplers",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
