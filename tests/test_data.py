"""Sharded data loaders: batch sharding, even_batches, split_batches, iterable shards, shuffling,
device placement, end-of-data signal, resumption and skip_first_batches."""

from __future__ import annotations

import itertools
from collections import namedtuple

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
)

from accel_nb.data import (
    BatchSamplerShard,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
    skip_first_batches,
)
from accel_nb.state import GradientState, PartialState
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


def _shards(n_items, batch_size, world, drop_last=False, split=False, even=True):
    bs = BatchSampler(SequentialSampler(range(n_items)), batch_size, drop_last)
    return [BatchSamplerShard(bs, world, r, split_batches=split, even_batches=even) for r in range(world)]


@pytest.mark.parametrize("n_items", [0, 1, 7, 8, 10, 13, 16, 21])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even", [False, True])
def test_batch_sampler_shard_covers_dataset_and_len_matches(n_items, batch_size, world, drop_last, even):
    shards = _shards(n_items, batch_size, world, drop_last=drop_last, even=even)
    per_rank = [list(s) for s in shards]
    for s, batches in zip(shards, per_rank):
        assert len(s) == len(batches), (s.process_index, batches)
    seen = [i for batches in per_rank for b in batches for i in b]
    full = list(BatchSampler(SequentialSampler(range(n_items)), batch_size, drop_last))
    expected = {i for b in full for i in b}
    if drop_last:
        assert set(seen) <= expected
        assert len(seen) == len(set(seen))  # nothing duplicated when dropping
    else:
        assert set(seen) == expected  # every sample is read by some rank
    if even:
        assert len({len(b) for b in per_rank}) <= 1  # every rank the same number of batches
        assert all(len(b) == batch_size for batches in per_rank for b in batches)


def test_even_batches_last_round_wraps_around_from_the_start():
    r0, r1 = (list(s) for s in _shards(10, 4, 2))
    assert r0 == [[0, 1, 2, 3], [8, 9, 0, 1]]
    assert r1 == [[4, 5, 6, 7], [2, 3, 4, 5]]
    shard = _shards(10, 4, 2)[0]
    assert shard.expected_last_round_real() == 2


def test_uneven_batches_when_even_batches_is_off():
    r0, r1 = (list(s) for s in _shards(10, 4, 2, even=False))
    assert r0 == [[0, 1, 2, 3], [8, 9]]
    assert r1 == [[4, 5, 6, 7]]


def test_split_batches_cuts_each_batch():
    r0, r1 = (list(s) for s in _shards(10, 4, 2, split=True))
    assert r0 == [[0, 1], [4, 5], [8, 9]]
    assert r1 == [[2, 3], [6, 7], [0, 1]]
    with pytest.raises(ValueError, match="divisible"):
        _shards(10, 3, 2, split=True)


def test_seedable_sampler_depends_only_on_seed_and_epoch():
    # a finished pass moves the sampler to the next epoch (as in the reference), so each read sets it
    a, b = SeedableRandomSampler(range(20), seed=3), SeedableRandomSampler(range(20), seed=3)
    assert list(a) == list(b) and a.epoch == b.epoch == 1
    a.set_epoch(0)
    first = list(a)
    assert sorted(first) == list(range(20))
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(second) == list(range(20))
    b.set_epoch(1)
    assert list(b) == second


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("n", [0, 5, 8, 11])
def test_iterable_shard_equal_counts_and_coverage(n):
    shards = [
        list(IterableDatasetShard(Stream(n), batch_size=2, num_processes=2, process_index=r))
        for r in range(2)
    ]
    assert len(shards[0]) == len(shards[1])
    assert set(shards[0]) | set(shards[1]) == set(range(n))
    if n == 5:
        assert shards == [[0, 1, 4, 0], [2, 3, 1, 2]]
    dropped = [
        list(IterableDatasetShard(Stream(n), 2, drop_last=True, num_processes=2, process_index=r))
        for r in range(2)
    ]
    assert len(dropped[0]) == len(dropped[1]) == (n // 4) * 2


def _dl(n=10, bs=4, **kw):
    ds = TensorDataset(torch.arange(n))
    return DataLoader(ds, batch_size=bs, **kw)


def _ids(loader):
    return [b[0].tolist() for b in loader]


def test_prepared_loader_len_shards_and_device():
    r0 = prepare_data_loader(_dl(), num_processes=2, process_index=0, device=torch.device("cpu"))
    r1 = prepare_data_loader(_dl(), num_processes=2, process_index=1, device=torch.device("cpu"))
    assert isinstance(r0, DataLoader) and len(r0) == len(r1) == 2
    assert _ids(r0) == [[0, 1, 2, 3], [8, 9, 0, 1]] and _ids(r1) == [[4, 5, 6, 7], [2, 3, 4, 5]]
    assert r0.last_round_real == 2 and r0.remainder == 2 and r0.total_batch_size == 8


def test_shuffle_is_shared_by_ranks_and_changes_per_epoch():
    loaders = [
        prepare_data_loader(_dl(16, 2, shuffle=True), num_processes=2, process_index=r, data_seed=7)
        for r in range(2)
    ]
    e0 = [_ids(dl) for dl in loaders]
    flat = sorted(i for rank in e0 for b in rank for i in b)
    assert flat == list(range(16))  # the two ranks read disjoint halves of one permutation
    e1 = [_ids(dl) for dl in loaders]  # the epoch advances by itself after a full pass
    assert e1 != e0 and sorted(i for rank in e1 for b in rank for i in b) == list(range(16))
    for dl in loaders:
        dl.set_epoch(0)
    assert [_ids(dl) for dl in loaders] == e0


def test_generator_seed_is_respected():
    a = prepare_data_loader(
        _dl(16, 4, shuffle=True, generator=torch.Generator().manual_seed(5)), num_processes=1, process_index=0
    )
    b = prepare_data_loader(
        _dl(16, 4, shuffle=True, generator=torch.Generator().manual_seed(5)), num_processes=1, process_index=0
    )
    assert _ids(a) == _ids(b)


Pair = namedtuple("Pair", "x y")


class Nested(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"a": torch.tensor([i]), "pair": Pair(torch.tensor(i), [torch.tensor(2 * i)]), "name": f"s{i}"}


def test_nested_batches_keep_structure_on_device():
    dl = prepare_data_loader(
        DataLoader(Nested(), batch_size=2, pin_memory=False),
        num_processes=1,
        process_index=0,
        device=torch.device("cpu"),
    )
    batch = next(iter(dl))
    assert isinstance(batch["pair"], Pair) and batch["pair"].y[0].tolist() == [0, 2]
    assert batch["name"] == ["s0", "s1"] and batch["a"].device.type == "cpu"


def test_end_of_dataloader_signal_and_gradient_state_registration():
    gs = GradientState()
    dl = prepare_data_loader(_dl(10, 4), num_processes=1, process_index=0)
    flags = []
    for _ in dl:
        flags.append((gs.end_of_dataloader, gs.active_dataloader is dl))
    assert flags == [(False, True), (False, True), (True, True)]
    assert gs.active_dataloader is None


def test_break_out_unregisters_the_loader():
    gs = GradientState()
    dl = prepare_data_loader(_dl(10, 2), num_processes=1, process_index=0)
    for _ in dl:
        break
    assert gs.active_dataloader is None
    assert dl.epoch == 0  # an unfinished pass does not advance the epoch


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_continues_with_next_batch_and_same_order(shuffle, num_workers):
    def make(rank):
        return prepare_data_loader(
            _dl(22, 3, shuffle=shuffle, num_workers=num_workers),
            num_processes=2,
            process_index=rank,
            data_seed=11,
        )

    for rank in range(2):
        ref = make(rank)
        _ids(ref)  # epoch 0
        full = _ids(ref)  # epoch 1, uninterrupted
        run = make(rank)
        _ids(run)
        it = iter(run)
        half = [next(it)[0].tolist() for _ in range(2)]
        state = run.state_dict()
        assert state["epoch"] == 1 and state["batches_yielded"] == 2
        del it
        fresh = make(rank)
        fresh.load_state_dict(state)
        rest = _ids(fresh)
        assert half + rest == full
        assert fresh.epoch == 2 and fresh.state_dict()["batches_yielded"] == 0
        assert _ids(fresh) == _ids(ref)  # and the following epoch matches too


def test_resume_after_a_finished_pass_starts_the_next_epoch():
    dl = prepare_data_loader(_dl(8, 2, shuffle=True), num_processes=1, process_index=0, data_seed=1)
    it = iter(dl)
    for _ in range(4):
        next(it)
    state = dl.state_dict()
    assert state["batches_yielded"] == 4
    fresh = prepare_data_loader(_dl(8, 2, shuffle=True), num_processes=1, process_index=0, data_seed=1)
    fresh.load_state_dict(state)
    ref = prepare_data_loader(_dl(8, 2, shuffle=True), num_processes=1, process_index=0, data_seed=1)
    _ids(ref)
    assert _ids(fresh) == _ids(ref)


def test_skip_first_batches_prepared_and_plain():
    dl = prepare_data_loader(_dl(10, 2), num_processes=1, process_index=0)
    skipped = skip_first_batches(dl, 3)
    assert isinstance(skipped, DataLoaderShard) and len(skipped) == 2
    assert _ids(skipped) == [[6, 7], [8, 9]]
    plain = skip_first_batches(_dl(10, 2), 4)
    assert _ids(plain) == [[8, 9]] and len(plain) == 1
    stream = skip_first_batches(DataLoader(Stream(7), batch_size=2), 2)
    assert [b.tolist() for b in stream] == [[4, 5], [6]]


class Counting(Dataset):
    def __init__(self):
        self.loaded = []

    def __len__(self):
        return 10

    def __getitem__(self, i):
        self.loaded.append(i)
        return i


def test_skip_does_not_load_skipped_samples():
    ds = Counting()
    dl = skip_first_batches(
        prepare_data_loader(DataLoader(ds, batch_size=2), num_processes=1, process_index=0), 4
    )
    assert [b.tolist() for b in dl] == [[8, 9]]
    assert ds.loaded == [8, 9]


def test_iterable_loader_resume_and_len():
    def make(rank):
        return prepare_data_loader(  # every process reads its slice (no group here to dispatch over)
            DataLoader(Stream(13), batch_size=2), num_processes=2, process_index=rank, dispatch_batches=False
        )

    full = [b.tolist() for b in make(0)]
    run = make(0)
    it = iter(run)
    first = [next(it).tolist() for _ in range(2)]
    state = run.state_dict()
    del it
    fresh = make(0)
    fresh.load_state_dict(state)
    assert first + [b.tolist() for b in fresh] == full


def test_already_prepared_loader_is_refused():
    dl = prepare_data_loader(_dl(), num_processes=1, process_index=0)
    with pytest.raises(ValueError, match="already prepared"):
        prepare_data_loader(dl, num_processes=1, process_index=0)


def _sharded_shuffle_without_seed():
    torch.manual_seed(1000 + PartialState().process_index)  # ranks start with different RNGs
    dl = prepare_data_loader(_dl(12, 2, shuffle=True))
    return _ids(dl)


@pytest.mark.multiproc
def test_ranks_agree_on_shuffle_even_with_different_rngs():
    r0, r1 = run_ranks(_sharded_shuffle_without_seed, 2)
    flat = [i for b in itertools.chain(r0, r1) for i in b]
    assert sorted(flat) == list(range(12))


def test_resumed_pass_leaves_the_global_rng_alone():
    def make():
        return prepare_data_loader(_dl(12, 2, shuffle=True), num_processes=1, process_index=0, data_seed=3)

    ref = make()
    it = iter(ref)
    next(it)
    next(it)
    state = ref.state_dict()
    torch.manual_seed(99)
    expected = torch.rand(3)  # what the uninterrupted run would draw next
    fresh = make()
    fresh.load_state_dict(state)
    torch.manual_seed(99)
    assert len(_ids(fresh)) == 4
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(99)
    _ids(fresh)  # a normal (not resumed) pass draws the iterator seed as torch does
    assert not torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("n_items", [0, 1, 5, 8, 11, 16])
@pytest.mark.parametrize("batch_size,world", [(2, 2), (4, 2), (6, 3), (3, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("even", [False, True])
def test_split_batches_covers_dataset_and_len_matches(n_items, batch_size, world, drop_last, even):
    shards = _shards(n_items, batch_size, world, drop_last=drop_last, split=True, even=even)
    per_rank = [list(s) for s in shards]
    for s, batches in zip(shards, per_rank):
        assert len(s) == len(batches)
    full = list(BatchSampler(SequentialSampler(range(n_items)), batch_size, drop_last))
    seen = [i for batches in per_rank for b in batches for i in b]
    assert set(seen) == {i for b in full for i in b}
    if even:
        assert all(len(b) == batch_size // world for batches in per_rank for b in batches)
        assert len({len(b) for b in per_rank}) <= 1
    else:
        assert sorted(seen) == sorted(i for b in full for i in b)  # no copies without even_batches


# -- shuffling as plain PyTorch does (use_seedable_sampler=False, the default) ---------------------------
def _plain_passes(passes, **kw):
    loader = _dl(20, 3, shuffle=True, **kw)
    return [_ids(loader) for _ in range(passes)]


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_one_process_shuffles_and_draws_exactly_as_plain_pytorch(with_generator, num_workers):
    def kw():
        return {
            "num_workers": num_workers,
            "generator": torch.Generator().manual_seed(3) if with_generator else None,
        }

    torch.manual_seed(5)
    plain = _plain_passes(2, **kw())
    plain_next = torch.rand(2)  # the global RNG after the passes
    torch.manual_seed(5)
    loader = prepare_data_loader(_dl(20, 3, shuffle=True, **kw()), num_processes=1, process_index=0)
    assert [_ids(loader) for _ in range(2)] == plain
    assert torch.equal(torch.rand(2), plain_next)
    assert plain[0] != plain[1] and sorted(sum(plain[0], [])) == list(range(20))


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("num_workers", [0, 1, "persistent"])
def test_a_plain_shuffle_resumes_mid_pass_with_the_same_order(with_generator, num_workers):
    def make():
        gen = torch.Generator().manual_seed(3) if with_generator else None
        workers = (
            {"num_workers": 1, "persistent_workers": True}
            if num_workers == "persistent"
            else {"num_workers": num_workers}
        )
        return prepare_data_loader(
            _dl(20, 3, shuffle=True, generator=gen, **workers), num_processes=1, process_index=0
        )

    torch.manual_seed(5)
    ref = make()
    full = [_ids(ref) for _ in range(3)]
    torch.manual_seed(5)
    run = make()
    _ids(run)
    it = iter(run)
    half = [next(it)[0].tolist() for _ in range(3)]
    state, rng = run.state_dict(), torch.get_rng_state()
    del it
    fresh = make()  # a new process: its own generator and global RNG, restored below
    fresh.load_state_dict(state)
    torch.set_rng_state(rng)  # as load_state does last
    assert half + _ids(fresh) == full[1]
    assert _ids(fresh) == full[2]  # the following pass too
    assert sorted(state["shuffle"]) == (
        ["base_seed_drawn", "generator_state"] if with_generator else ["seed"]
    )


def _shuffled_ids(seeded_generator):
    torch.manual_seed(100 + PartialState().process_index)  # ranks start with different RNGs
    gen = torch.Generator().manual_seed(9) if seeded_generator else None
    loader = prepare_data_loader(_dl(16, 2, shuffle=True, generator=gen))
    return [_ids(loader) for _ in range(2)]


@pytest.mark.multiproc
def test_two_ranks_take_alternate_batches_of_one_plain_pytorch_order():
    for seeded in (False, True):
        r0, r1 = run_ranks(_shuffled_ids, 2, args=(seeded,))
        for e0, e1 in zip(r0, r1, strict=True):
            assert sorted(i for b in e0 + e1 for i in b) == list(range(16))
        assert r0[0] != r0[1]  # a new permutation each pass
    plain = _dl(16, 4, shuffle=True, generator=torch.Generator().manual_seed(9))
    one_process = [_ids(plain) for _ in range(2)]
    assert [
        [a + b for a, b in zip(e0, e1, strict=True)] for e0, e1 in zip(r0, r1, strict=True)
    ] == one_process


class Reversed(SequentialSampler):
    def __iter__(self):
        return iter(range(len(self.data_source) - 1, -1, -1))


@pytest.mark.parametrize("world", [1, 2])
def test_the_sampler_of_a_given_batch_sampler_is_kept(world):
    ds = TensorDataset(torch.arange(8))
    loader = DataLoader(ds, batch_sampler=BatchSampler(Reversed(ds), 2, False))
    got = [_ids(prepare_data_loader(loader, num_processes=world, process_index=r)) for r in range(world)]
    assert [b for rank in got for b in rank] == (
        [[7, 6], [5, 4], [3, 2], [1, 0]] if world == 1 else [[7, 6], [3, 2], [5, 4], [1, 0]]
    )


# -- BatchSamplerShard where the reference library's rules are specific ---------------------------------
def test_a_short_last_batch_split_without_even_batches_goes_to_the_first_ranks():
    shards = _shards(10, 4, 2, split=True, even=False)  # batches of 4, 4, 2; 2 samples per rank
    assert [list(s) for s in shards] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7]]]
    assert [len(s) for s in shards] == [3, 2]


def test_a_list_of_index_lists_completes_its_last_round_with_whole_first_batches():
    batches = [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9, 10], [11]]
    even = [BatchSamplerShard(batches, 2, r) for r in range(2)]
    assert [list(s) for s in even] == [[[0, 1, 2], [6, 7], [11]], [[3, 4, 5], [8, 9, 10], [0, 1, 2]]]
    assert [len(s) for s in even] == [3, 3] and even[1].last_round_real == 1  # [11] is real, [0, 1, 2] a copy
    uneven = [list(BatchSamplerShard(batches, 2, r, even_batches=False)) for r in range(2)]
    assert uneven == [[[0, 1, 2], [6, 7], [11]], [[3, 4, 5], [8, 9, 10]]]
    with pytest.raises(ValueError, match="split_batches=True needs a batch sampler with a fixed batch_size"):
        BatchSamplerShard(batches, 2, 0, split_batches=True, even_batches=False)


class EpochSampler(SequentialSampler):
    epoch = -1

    def set_epoch(self, epoch):
        self.epoch = epoch


class PairsOf:
    """A batch sampler of its own (not torch's BatchSampler): pairs of its sampler's indices."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        order = list(self.sampler)
        return iter([order[i : i + 2] for i in range(0, len(order), 2)])

    def __len__(self):
        return (len(self.sampler) + 1) // 2


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("batch_sampler", [lambda s: BatchSampler(s, 2, False), PairsOf])
def test_set_epoch_reaches_the_sampler_inside_a_given_batch_sampler(world, batch_sampler):
    ds = TensorDataset(torch.arange(8))
    sampler = EpochSampler(ds)
    loader = prepare_data_loader(
        DataLoader(ds, batch_sampler=batch_sampler(sampler)), num_processes=world, process_index=0
    )
    loader.set_epoch(3)
    assert sampler.epoch == 3
    assert _ids(loader) == ([[0, 1], [2, 3], [4, 5], [6, 7]] if world == 1 else [[0, 1], [4, 5]])


def test_seedable_random_sampler_takes_the_reference_keywords_and_gives_its_orders():
    reference = pytest.importorskip("accelerate.data_loader").SeedableRandomSampler
    data = list(range(11))
    for kwargs in ({"data_seed": 5}, {"data_seed": 5, "generator": torch.Generator().manual_seed(3)}, {}):
        ours, theirs = SeedableRandomSampler(data, **kwargs), reference(data, **kwargs)
        orders = []
        for sampler in (ours, theirs):
            sampler.set_epoch(2)
            orders.append(list(sampler))
        assert orders[0] == orders[1], kwargs
    assert (
        SeedableRandomSampler(data, seed=4).seed == 4
        and SeedableRandomSampler(data).seed == torch.initial_seed()
    )


def _seedable_passes(library, seeded_generator):
    import importlib

    module, utils = importlib.import_module(library), importlib.import_module(f"{library}.utils")
    config = utils.DataLoaderConfiguration(use_seedable_sampler=True)
    accelerator = module.Accelerator(cpu=True, dataloader_config=config)
    utils.set_seed(3)
    gen = torch.Generator().manual_seed(42) if seeded_generator else None
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True, generator=gen))
    passes = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        passes.append([b.tolist() for b in loader])
    return passes, torch.rand(1).item()  # and the global RNG afterwards


@pytest.mark.multiproc
@pytest.mark.parametrize("seeded_generator", [False, True])
def test_the_seedable_sampler_shuffles_as_the_reference(seeded_generator):
    pytest.importorskip("accelerate")
    ours, theirs = (
        run_ranks(_seedable_passes, 2, args=(lib, seeded_generator)) for lib in ("accel_nb", "accelerate")
    )
    assert ours == theirs
    assert ours[0][0][0] != ours[0][0][1]  # a new order each epoch


class _ShardedStream(torch.utils.data.IterableDataset):
    """The sharding protocol of Hugging Face ``datasets.IterableDataset``: ``n_shards`` and ``shard()``."""

    def __init__(self, shards):
        self.shards = shards

    @property
    def n_shards(self):
        return len(self.shards)

    def shard(self, num_shards, index):
        return _ShardedStream(self.shards[index::num_shards])

    def __iter__(self):
        for shard in self.shards:
            yield from shard


@pytest.mark.parametrize("n_shards", [2, 4])
def test_an_iterable_dataset_with_a_shard_per_process_is_split_by_its_shards(n_shards):
    # as the reference splits a datasets.IterableDataset (issue 33 #6): each process reads its own shards
    data = [list(range(i * 5, i * 5 + 5)) for i in range(n_shards)]
    ranks = [
        prepare_data_loader(
            DataLoader(_ShardedStream(data), batch_size=2),
            num_processes=2,
            process_index=r,
            dispatch_batches=False,
        )
        for r in range(2)
    ]
    for r, loader in enumerate(ranks):
        expected = [x for shard in data[r::2] for x in shard]
        assert loader.dataset.shards == data[r::2]
        assert [x for batch in loader for x in batch.tolist()] == expected
    # fewer shards than processes: the stream is read by every process and split by batches, as before
    one = prepare_data_loader(
        DataLoader(_ShardedStream(data[:1]), batch_size=2),
        num_processes=2,
        process_index=1,
        dispatch_batches=False,
    )
    assert not isinstance(one.dataset, _ShardedStream) and next(iter(one)).tolist() == [2, 3]
