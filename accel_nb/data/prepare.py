"""``prepare_data_loader``: the one place that picks how a loader is shared out (sharded or dispatched).

``Accelerator.prepare`` calls it with the :class:`DataLoaderConfiguration` settings: a map-style
loader gets a sharded batch sampler inside a :class:`~accel_nb.data.loader.DataLoaderShard`, an
iterable one an :class:`~accel_nb.data.samplers.IterableDatasetShard` (a Hugging Face
``datasets.IterableDataset`` with a shard per process is split by its shards), and ``dispatch_batches``
a :class:`~accel_nb.data.dispatch.DataLoaderDispatcher` that only process 0 reads.

    loader = prepare_data_loader(DataLoader(ds, batch_size=8, shuffle=True), num_processes=2, process_index=0)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from ..state import PartialState
from .dispatch import prepare_dispatcher
from .loader import DataLoaderShard, loader_kwargs, require_torchdata
from .samplers import BatchSamplerShard, IterableDatasetShard
from .shuffling import give_generator, random_sampler, resolve_sampler

__all__ = ["DataLoaderConfiguration", "prepare_data_loader"]


@dataclass
class DataLoaderConfiguration:
    """How ``Accelerator.prepare`` shards data loaders (same names as the reference library).

    By default a shuffled loader keeps its ``RandomSampler`` and generator (the order plain PyTorch
    gives), copied from rank 0 at each pass. ``use_seedable_sampler=True`` or a ``data_seed`` uses
    a ``SeedableRandomSampler`` (order = f(seed, epoch)); without ``data_seed`` its seed is
    rank 0's ``torch.initial_seed()`` (your ``set_seed``), shared with every rank.

    ``dispatch_batches=True`` has process 0 read every batch and send each process its slice
    (``accel_nb.data.dispatch``); ``None`` (the default) does so for iterable datasets only.
    ``use_stateful_dataloader=True`` (needs ``torchdata``) makes the prepared loader iterate a
    ``torchdata.stateful_dataloader.StatefulDataLoader`` underneath (``loader.base_dataloader``);
    ``state_dict()`` / ``load_state_dict()`` and ``save_state`` / ``load_state`` resume it mid-epoch
    exactly as they do the plain loader.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


def _data_shard_of(mesh: Any) -> tuple[int, int]:
    """(data shards, this process's shard) of a device mesh, as the reference reads them: the ``tp`` and
    ``cp`` groups of a rank share its batches, ``dp_replicate`` x ``dp_shard`` count the shards."""
    names = tuple(mesh.mesh_dim_names or ())

    def size(name: str) -> int:
        return mesh[name].size() if name in names else 1

    rank = PartialState().process_index
    return size("dp_replicate") * size("dp_shard"), rank // (size("tp") * size("cp"))


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    even_batches: bool = True,
    put_on_device: bool = False,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    rng_types: list[str] | None = None,
    dispatch_batches: bool | None = None,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    slice_fn_for_dispatch: Any = None,
) -> DataLoader:
    """Shard ``dataloader`` for this process, and place its batches on ``device`` when ``put_on_device``
    (off by default, as in the reference; ``Accelerator.prepare`` turns it on).

    ``dispatch_batches`` (``None``: for iterable datasets) makes process 0 read the batches and
    send each process its slice (:class:`accel_nb.data.dispatch.DataLoaderDispatcher`).

    ``rng_types`` (e.g. ``["torch", "generator"]``) are synchronised from process 0 at the start
    of every pass, so random draws agree across processes; a shuffle's generator always is
    (``accel_nb.data.shuffling``). ``data_seed`` implies ``use_seedable_sampler``.

    ``use_stateful_dataloader=True`` (needs ``torchdata``) reads through a torchdata
    ``StatefulDataLoader`` (``loader.base_dataloader``); batches and resumption are unchanged.

    As in the reference, ``torch_device_mesh`` (a mesh with ``dp_replicate``/``dp_shard``/``cp``/``tp``
    dimensions) gives every tensor- and context-parallel group the same batches, and
    ``slice_fn_for_dispatch(batch, slice, process_index=, num_processes=)`` cuts each dispatched round.

        loader = prepare_data_loader(DataLoader(ds, batch_size=16, shuffle=True))
    """
    if torch_device_mesh is not None:
        num_processes, process_index = _data_shard_of(torch_device_mesh)
    if num_processes is None or process_index is None:
        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
        device = state.device if device is None and put_on_device else device
    if isinstance(dataloader, DataLoaderShard):
        raise ValueError(
            "this data loader was already prepared; pass the original DataLoader to prepare() once "
            "and keep the object it returns"
        )
    if use_stateful_dataloader:
        require_torchdata()
    if dispatch_batches is None:
        dispatch_batches = put_on_device and isinstance(dataloader.dataset, IterableDataset)
    if dispatch_batches:
        if not put_on_device:
            raise ValueError(
                "dispatch_batches=True needs put_on_device=True (batches are sent to each device)"
            )
        return prepare_dispatcher(
            dataloader,
            device,
            num_processes,
            process_index,
            split_batches,
            non_blocking,
            rng_types,
            use_stateful_dataloader,
            slice_fn_for_dispatch,
        )
    if not put_on_device:
        device = None
    kwargs = loader_kwargs(dataloader)
    info = {
        "num_processes": num_processes,
        "process_index": process_index,
        "split_batches": split_batches,
        "even_batches": even_batches,
    }
    dataset = dataloader.dataset
    if isinstance(dataset, IterableDataset):
        batch_size = dataloader.batch_size
        if batch_size is None:
            warnings.warn(
                "a DataLoader with batch_size=None over an iterable dataset is not sharded", stacklevel=2
            )
            return dataloader
        info["batch_size"] = batch_size
        if num_processes > 1 and not split_batches and _has_a_shard_per_process(dataset, num_processes):
            # a Hugging Face datasets IterableDataset: each process reads its own shards, as in the reference
            return DataLoaderShard(
                dataset.shard(num_shards=num_processes, index=process_index),
                device=device,
                non_blocking=non_blocking,
                _source=dataloader,
                _shard_info=info,
                batch_size=batch_size,
                drop_last=dataloader.drop_last,
                rng_types=rng_types,
                use_stateful_dataloader=use_stateful_dataloader,
                **kwargs,
            )
        shard = IterableDatasetShard(
            dataset,
            batch_size=batch_size,
            drop_last=dataloader.drop_last,
            num_processes=num_processes,
            process_index=process_index,
            split_batches=split_batches,
            even_batches=even_batches,
        )
        per_rank = batch_size // num_processes if split_batches else batch_size
        return DataLoaderShard(
            shard,
            device=device,
            non_blocking=non_blocking,
            _source=dataloader,
            _shard_info=info,
            batch_size=per_rank,
            drop_last=dataloader.drop_last,
            rng_types=rng_types,
            use_stateful_dataloader=use_stateful_dataloader,
            **kwargs,
        )
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is None:
        warnings.warn(
            "a DataLoader with batch_size=None (no automatic batching) is not sharded; it is returned unchanged",
            stacklevel=2,
        )
        return dataloader
    if type(batch_sampler) is BatchSampler:  # the user's sampler is the batch sampler's, not dl.sampler
        sampler = resolve_sampler(
            batch_sampler.sampler, data_seed, use_seedable_sampler or data_seed is not None
        )
        if sampler is not batch_sampler.sampler:
            batch_sampler = BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    info["batch_size"] = getattr(batch_sampler, "batch_size", None)
    synchronized = give_generator(random_sampler(batch_sampler)) if num_processes > 1 else None
    if num_processes > 1 or split_batches:
        batch_sampler = BatchSamplerShard(
            batch_sampler,
            num_processes=num_processes,
            process_index=process_index,
            split_batches=split_batches,
            even_batches=even_batches,
        )
    return DataLoaderShard(
        dataset,
        device=device,
        non_blocking=non_blocking,
        _source=dataloader,
        _shard_info=info,
        batch_sampler=batch_sampler,
        rng_types=rng_types,
        synchronized_generator=synchronized,
        use_stateful_dataloader=use_stateful_dataloader,
        **kwargs,
    )


def _has_a_shard_per_process(dataset: Any, num_processes: int) -> bool:
    """Whether ``dataset`` splits itself across processes, as a Hugging Face ``datasets.IterableDataset``
    with at least ``num_processes`` shards does (duck-typed: an int ``n_shards`` and a
    ``shard(num_shards=, index=)`` method, so accel_nb needs no ``datasets`` import)."""
    n_shards = getattr(dataset, "n_shards", None)
    return (
        isinstance(n_shards, int) and n_shards >= num_processes and callable(getattr(dataset, "shard", None))
    )
