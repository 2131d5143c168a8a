"""Shim at the reference's ``accelerate.data_loader`` path: accel_nb's sharded loaders and samplers.

    from accel_nb.data_loader import BatchSamplerShard, prepare_data_loader, skip_first_batches

Nothing is defined here; each name is the one implementation in the ``accel_nb.data`` package
(``loader``, ``prepare``, ``dispatch``, ``samplers``, ``loader_state``), imported on first use.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .reexports import reexports

_EXPORTS = {
    "DataLoaderShard": "accel_nb.data.loader",
    "DataLoaderStateMixin": "accel_nb.data.loader_state",
    "DataLoaderDispatcher": "accel_nb.data.dispatch",
    "SkipDataLoader": "accel_nb.data.skipping",
    "prepare_data_loader": "accel_nb.data.prepare",
    "skip_first_batches": "accel_nb.data.skipping",
    "BatchSamplerShard": "accel_nb.data.samplers",
    "IterableDatasetShard": "accel_nb.data.samplers",
    "SeedableRandomSampler": "accel_nb.data.samplers",
    "SkipBatchSampler": "accel_nb.data.samplers",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
