"""Sharded, device-placing, resumable data loaders.

``Accelerator.prepare`` turns a ``torch.utils.data.DataLoader`` into a :class:`DataLoaderShard`:
every process reads its own share of the batches, batches arrive on the process's device,
shuffling is the same on every rank (``accel_nb.data.shuffling``: the sampler's generator is copied from
rank 0 at each pass, or a seeded sampler reshuffled per epoch), the loader tells
``GradientState`` when it yields its last batch, and ``state_dict()`` / ``load_state_dict()``
let a resumed run continue with the next batch.

    loader = prepare_data_loader(DataLoader(ds, batch_size=8, shuffle=True), num_processes=2, process_index=0)
    for batch in loader:          # this rank's batches, already on its device
        ...
    rest = skip_first_batches(loader, 10)   # same loader, first 10 batches not even loaded (data/skipping.py)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..ops import broadcast_object_list, send_to_device
from ..state import GradientState
from .loader_state import DataLoaderStateMixin
from .random_sync import synchronize_rng_states
from .samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler, SkipBatchSampler
from .shuffling import PassShuffle, random_sampler

__all__ = ["DataLoaderShard", "loader_kwargs", "require_torchdata"]


# -- the loader -------------------------------------------------------------------------------------
def _innermost_sampler(batch_sampler: Any) -> Any:
    while batch_sampler is not None and not hasattr(batch_sampler, "set_epoch"):
        inner = getattr(batch_sampler, "batch_sampler", None)
        if inner is None:
            inner = getattr(batch_sampler, "sampler", None)
        if inner is None or inner is batch_sampler:
            return None
        batch_sampler = inner
    return batch_sampler


def _epoch_targets(batch_sampler: Any) -> list[Any]:
    """Every object down the chain from ``batch_sampler`` (through ``batch_sampler`` / ``sampler``) that takes
    ``set_epoch``: a custom batch sampler and the distributed or seeded sampler inside it both reshuffle."""
    found: list[Any] = []
    seen: set[int] = set()
    node = batch_sampler
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if callable(getattr(node, "set_epoch", None)):
            found.append(node)
        inner = getattr(node, "batch_sampler", None)
        node = inner if inner is not None else getattr(node, "sampler", None)
    return found


def loader_kwargs(dl: DataLoader) -> dict[str, Any]:
    """The settings of ``dl`` that a rebuilt loader keeps (workers, collate, pinning...)."""
    kw: dict[str, Any] = {
        "num_workers": dl.num_workers,
        "collate_fn": dl.collate_fn,
        "pin_memory": dl.pin_memory,
        "timeout": dl.timeout,
        "worker_init_fn": dl.worker_init_fn,
        "multiprocessing_context": dl.multiprocessing_context,
        "generator": dl.generator,
        "persistent_workers": dl.persistent_workers,
    }
    if dl.num_workers > 0:
        kw["prefetch_factor"] = dl.prefetch_factor
    if getattr(dl, "pin_memory_device", ""):
        kw["pin_memory_device"] = dl.pin_memory_device
    if getattr(dl, "in_order", True) is not True:
        kw["in_order"] = dl.in_order
    return kw


def _new_instance(cls: type) -> Any:
    """An empty instance of ``cls``, for unpickling (its ``__dict__`` is set afterwards)."""
    return cls.__new__(cls)


class DataLoaderShard(DataLoader, DataLoaderStateMixin):
    """A ``DataLoader`` that yields this rank's batches on ``device`` and can resume mid-epoch.

    Built by :func:`prepare_data_loader` (``Accelerator.prepare``). On top of a DataLoader it has
    ``set_epoch(e)``, ``end_of_dataloader`` (true while the last batch is out), ``remainder`` (the
    samples of the last, short round over all processes, ``len(dataset) % total_batch_size``, set when a
    pass begins; -1 with ``drop_last`` or an unknown length), ``state_dict()`` / ``load_state_dict()``
    and ``len()`` = this rank's number of batches. As a ``DataLoaderStateMixin`` each pass starts
    with ``begin()`` (registers with ``GradientState``) and ends with ``end()``.
    """

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105
        """With ``use_stateful_dataloader=True``, torchdata's ``StatefulDataLoader`` (what this loader reads
        through), so ``isinstance(loader, StatefulDataLoader)`` holds as in the reference; ``type(loader)`` and
        ``isinstance(loader, DataLoaderShard)`` are unchanged."""
        base = self.__dict__.get("base_dataloader")
        return type(base) if base is not None else type(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled by its real class (``__class__`` may name torchdata's)."""
        return (_new_instance, (type(self),), dict(self.__dict__))

    def __getattr__(self, name: str) -> Any:
        # the reference's base_dataloader, the DataLoader that iterates: torchdata's twin when
        # use_stateful_dataloader (an instance attribute), else this loader itself (no reference cycle)
        if name == "base_dataloader":
            return self
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _twin(self) -> Any:
        """torchdata's StatefulDataLoader this loader reads through, or None."""
        return self.__dict__.get("base_dataloader")

    def __init__(
        self,
        dataset: Any,
        device: torch.device | None = None,
        non_blocking: bool = False,
        skip_batches: int = 0,
        _source: DataLoader | None = None,
        _shard_info: dict[str, Any] | None = None,
        rng_types: list[str] | None = None,
        synchronized_generator: torch.Generator | None = None,
        use_stateful_dataloader: bool = False,
        _own_skipper: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        # Skipping (skip_batches, a resumed pass) goes by index, through a SkipBatchSampler that the
        # iterators read (``_index_sampler``) but ``batch_sampler`` does not show: the prepared
        # loader's batch_sampler nests as the reference's (BatchSamplerShard(user's), or the user's).
        # ``_own_skipper``: the SkipBatchSampler given as batch_sampler is this loader's own skipper
        # (skip_first_batches of a prepared loader, a resumed pass) and its skip is ``skip_batches``; any
        # other one (skip_first_batches of a plain loader, then prepared) keeps its skip: it is wrapped.
        bs = self.batch_sampler
        self._index_skipper: SkipBatchSampler | None = None
        if bs is not None and not isinstance(dataset, IterableDataset):
            own = _own_skipper and isinstance(bs, SkipBatchSampler)
            self._index_skipper = bs if own else SkipBatchSampler(bs, 0)
        self.use_stateful_dataloader = bool(use_stateful_dataloader)
        if use_stateful_dataloader:  # without it, base_dataloader is the loader itself (__getattr__)
            self.base_dataloader = _stateful_twin(self)
        self.rng_types = rng_types  # synchronised from process 0 at the start of every pass
        self.synchronized_generator = synchronized_generator  # the shuffle's, copied from process 0 per pass
        self._shuffle = PassShuffle()
        self.device = device
        self.non_blocking = non_blocking
        self.skip_batches = int(skip_batches)  # skipped at the start of every pass
        self.epoch = 0
        self.batches_yielded = 0
        self.end_of_dataloader = False
        self._resume_skip = 0  # one-shot skip set by load_state_dict
        self._source = _source
        self._shard_info = dict(_shard_info or {})
        self.gradient_state = GradientState()
        # the mixin's begin() leaves remainder at -1 for a loader that drops its short last batch
        self._drop_last = bool((_source if _source is not None else self).drop_last)

    # -- sharding facts ---------------------------------------------------------------------------
    @property
    def total_batch_size(self) -> int | None:
        """Samples per step over all processes (a loader built by hand: its batch sampler's batch size)."""
        info = self._shard_info
        if not info:
            sampler = self.batch_sampler
            bs = getattr(sampler, "batch_size", None)
            if bs is None:
                return None
            return (
                bs if getattr(sampler, "split_batches", False) else bs * getattr(sampler, "num_processes", 1)
            )
        bs = info.get("batch_size")
        if bs is None:
            return None
        return bs if info.get("split_batches") else bs * info.get("num_processes", 1)

    @property
    def total_dataset_length(self) -> int | None:
        try:
            return len(self.dataset)
        except TypeError:
            return None

    @property
    def last_round_real(self) -> int | None:
        """Real samples (all ranks together) in the current last batch round when it was padded."""
        bs = self.batch_sampler
        while bs is not None:
            if isinstance(bs, BatchSamplerShard):
                value = bs.expected_last_round_real()
                return value if value is not None else bs.last_round_real
            bs = getattr(bs, "batch_sampler", None)
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.last_round_real
        return None

    @property
    def iteration(self) -> int:
        """The reference library's name for :attr:`epoch`: the pass the next iteration makes (0 first)."""
        return self.epoch

    @iteration.setter
    def iteration(self, value: int) -> None:
        self.epoch = int(value)

    # -- epochs and resumption ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle order of ``epoch`` on the next pass (the same on every rank)."""
        if epoch != self.epoch:
            self.batches_yielded = 0
            self._resume_skip = 0
        self.epoch = int(epoch)
        self._apply_epoch()

    def _apply_epoch(self) -> None:
        for target in _epoch_targets(self.batch_sampler):
            target.set_epoch(self.epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)

    def _sampler_seed(self) -> int | None:
        target = _innermost_sampler(self.batch_sampler)
        return getattr(target, "seed", None)

    def _mid_pass(self) -> bool:
        done = self.batches_yielded
        return done > 0 and not (self._has_len() and done >= len(self) + self.skip_batches)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: ``{"epoch", "batches_yielded", "seed"}`` (plus the skip setting and,
        mid-pass, what the pass's shuffle was drawn from)."""
        state = {
            "epoch": self.epoch,
            "batches_yielded": self.batches_yielded,
            "seed": self._sampler_seed(),
            "skip_batches": self.skip_batches,
        }
        if self._mid_pass():
            shuffle = self._shuffle.saved()
            if shuffle is not None:
                state["shuffle"] = shuffle
        else:  # between passes (an epoch's end): what the next pass will draw from
            reused = self.persistent_workers and (self._twin() or self)._iterator is not None
            state["next_pass"] = self._shuffle.between_passes(random_sampler(self.batch_sampler), not reused)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next pass starts with the batch after the last one yielded."""
        seed = state.get("seed")
        target = _innermost_sampler(self.batch_sampler)
        if seed is not None and target is not None and hasattr(target, "seed"):
            target.seed = int(seed)
        self.skip_batches = int(state.get("skip_batches", self.skip_batches))
        if self._skip_in_sampler():
            self._index_skipper.skip_batches = self.skip_batches
        epoch = int(state.get("epoch", 0))
        done = int(state.get("batches_yielded", 0))
        if self._has_len() and done >= len(self) + self.skip_batches:
            epoch, done = epoch + 1, 0  # the saved pass had finished: start the next epoch
        self.epoch = epoch
        self.batches_yielded = done
        self._resume_skip = max(done - self.skip_batches, 0)
        if self._resume_skip:
            self._shuffle.restore(state.get("shuffle"), random_sampler(self.batch_sampler))
        else:
            self._shuffle.restore_between_passes(state.get("next_pass"), random_sampler(self.batch_sampler))
        self._apply_epoch()

    def _has_len(self) -> bool:
        try:
            len(self)
            return True
        except TypeError:
            return False

    def __len__(self) -> int:
        n = super().__len__()
        if isinstance(self.dataset, IterableDataset) and self.skip_batches:
            n = max(n - self.skip_batches, 0)
        return n

    # -- iteration -------------------------------------------------------------------------------
    @property
    def _index_sampler(self) -> Any:
        """What torch's iterators draw batches of indices from: the batch sampler behind its skipper."""
        skipper = self.__dict__.get("_index_skipper")
        if skipper is not None and self._auto_collation:
            return skipper
        return super()._index_sampler

    def unskipped_batch_sampler(self) -> Any:
        """The batch sampler this loader's own skipping wraps (a skip of the user's own stays in it)."""
        skipper = self._index_skipper
        return skipper.batch_sampler if skipper is not None else self.batch_sampler

    def _skip_in_sampler(self) -> bool:
        return self._index_skipper is not None

    def _synchronize_rngs(self) -> None:
        """Give every rank process 0's generator states (``rng_types``, the shuffle's) before a pass."""
        kinds = [t for t in self.rng_types or () if t != "generator"]
        target = _innermost_sampler(self.batch_sampler)
        if "generator" in (self.rng_types or ()) and isinstance(target, SeedableRandomSampler):
            # its order is its seed
            target.seed = int(broadcast_object_list([target.seed], from_process=0)[0])
        if self.synchronized_generator is not None:
            kinds.append("generator")
        synchronize_rng_states(kinds, self.synchronized_generator)

    def __iter__(self) -> Iterator[Any]:
        if self.rng_types or self.synchronized_generator is not None:
            self._synchronize_rngs()
        shuffler = random_sampler(self.batch_sampler)
        reused = self.persistent_workers and (self._twin() or self)._iterator is not None
        self._shuffle.begin(shuffler, self.generator, new_iterator=not reused)
        self._apply_epoch()
        resume = self._resume_skip
        self._resume_skip = 0
        if self._skip_in_sampler():  # skip by index: the skipped samples are never loaded
            self._index_skipper.skip_batches = self.skip_batches + resume
            to_drop = 0
        else:
            to_drop = self.skip_batches + resume
        self.batches_yielded = self.skip_batches + resume
        self.begin()  # not at the end, remainder of this pass, registered with GradientState
        try:
            if self._shuffle.keeps_rng_on_new_iterator:
                # resumed at an epoch's end where the saved run's persistent workers kept their
                # iterator (no base seed drawn): a throwaway generator gives this new iterator's
                with self._shuffle.loader_generator_hidden(self._twin() or self):
                    it = self._base_iter()
            elif resume:
                # the interrupted run drew the iterator's base seed from torch's global RNG when this
                # epoch began, before its RNG state was saved: the resumed pass must not draw again
                rng = torch.get_rng_state()
                try:
                    with self._shuffle.loader_generator_hidden(self._twin() or self):
                        it = self._base_iter()
                finally:
                    torch.set_rng_state(rng)
            else:
                it = self._base_iter()
            try:
                for _ in range(to_drop):
                    next(it)
                current = next(it)
            except StopIteration:
                self.end_of_dataloader = True
                self._finish_pass()
                return
            while True:
                try:
                    upcoming = next(it)
                except StopIteration:
                    upcoming = None
                    self.end_of_dataloader = True
                batch = self._place(current)
                self.batches_yielded += 1
                yield batch
                if self.end_of_dataloader:
                    break
                current = upcoming
            self._finish_pass()
        finally:
            if self._skip_in_sampler():
                self._index_skipper.skip_batches = self.skip_batches
            self._shuffle.end(shuffler)
            self.end()

    def _base_iter(self) -> Iterator[Any]:
        """A fresh pass of the underlying loader: torchdata's StatefulDataLoader when asked for, else this one.

        On an XLA device the pass goes through torch_xla's parallel loader (``accel_nb.xla.loader``),
        which uploads the next batches in the background.
        """
        it = iter(self._twin()) if self._twin() is not None else DataLoader.__iter__(self)
        if self.device is not None and self.device.type == "xla":
            from ..xla.loader import device_feed

            return device_feed(it, self.device)
        return it

    def _finish_pass(self) -> None:
        self.epoch += 1
        self.batches_yielded = 0

    def _place(self, batch: Any) -> Any:
        if self.device is None:
            return batch
        non_blocking = self.non_blocking or (self.pin_memory and self.device.type == "cuda")
        return send_to_device(batch, self.device, non_blocking=non_blocking)


def require_torchdata() -> None:
    """Raise a clear ImportError when torchdata's StatefulDataLoader is not installed."""
    try:
        import torchdata.stateful_dataloader  # noqa: F401
    except ImportError:
        raise ImportError(
            "use_stateful_dataloader=True needs torchdata's StatefulDataLoader: pip install torchdata "
            "(or pip install 'accel_nb[stateful]'), or drop the option -- accel_nb's prepared loaders "
            "resume mid-epoch through state_dict() without it"
        ) from None


def _stateful_twin(loader: DataLoader) -> Any:
    """A torchdata ``StatefulDataLoader`` reading what ``loader`` reads, the same way (same batch sampler)."""
    require_torchdata()
    from torchdata.stateful_dataloader import StatefulDataLoader

    kwargs = loader_kwargs(loader)
    if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
        batching: dict[str, Any] = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    else:  # the very skipper object: skips set on it reach the twin too
        batching = {"batch_sampler": getattr(loader, "_index_skipper", None) or loader.batch_sampler}
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in newer torch
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        return StatefulDataLoader(loader.dataset, **batching, **kwargs)
