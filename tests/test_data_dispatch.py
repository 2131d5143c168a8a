"""dispatch_batches: process 0 reads, every process gets its slice -- side by side with accelerate on
2 real gloo ranks; SkipDataLoader and use_stateful_dataloader."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc


class Stream(IterableDataset):
    """0..n-1 as (x, {"y": x * 10}) pairs, counting how often each process read it."""

    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __iter__(self):
        self.reads += 1
        return iter((torch.tensor([float(i)]), {"y": torch.tensor(i * 10)}) for i in range(self.n))


def _epoch(library, n, batch_size, split, even, iterable, dispatch, drop_last):
    utils = importlib.import_module(f"{library}.utils")
    config = utils.DataLoaderConfiguration(dispatch_batches=dispatch, split_batches=split, even_batches=even)
    acc = importlib.import_module(library).Accelerator(cpu=True, dataloader_config=config)
    dataset = (
        Stream(n) if iterable else [(torch.tensor([float(i)]), {"y": torch.tensor(i * 10)}) for i in range(n)]
    )
    loader = acc.prepare(DataLoader(dataset, batch_size=batch_size, drop_last=drop_last))
    batches, gathered = [], []
    for x, extra in loader:
        batches.append((x.flatten().tolist(), extra["y"].tolist(), acc.gradient_state.end_of_dataloader))
        gathered.extend(acc.gather_for_metrics(x).flatten().tolist())
    length = len(loader) if not iterable else None
    reads = dataset.reads if iterable else None
    return type(loader).__name__, length, batches, gathered, reads


CASES = [
    # n, batch_size, split_batches, even_batches, iterable, dispatch_batches, drop_last
    (7, 2, False, True, False, True, False),
    (7, 4, True, True, False, True, False),
    (7, 2, False, False, False, True, False),
    (11, 2, False, True, True, None, False),
    (5, 2, False, False, True, None, False),
    (3, 4, True, True, True, None, False),
    (9, 3, False, True, False, True, False),
    (7, 2, False, True, False, True, True),
    (8, 2, False, True, True, None, False),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_dispatched_batches_equal_the_reference(case):
    ours = run_ranks(_epoch, world_size=2, args=("accel_nb", *case))
    theirs = run_ranks(_epoch, world_size=2, args=("accelerate", *case))
    for rank, (a, b) in enumerate(zip(ours, theirs)):
        assert a[0] == "DataLoaderDispatcher"
        assert a[1:4] == b[1:4], f"rank {rank}"
    n, iterable = case[0], case[4]
    if not case[6]:  # every sample once in gather_for_metrics, without the copies
        assert sorted(ours[0][3]) == [float(i) for i in range(n)]
    if iterable:  # only process 0 read the stream
        assert [r[4] for r in ours] == [1, 0]


def test_dispatch_batches_false_keeps_iterable_sharding():
    results = run_ranks(_epoch, world_size=2, args=("accel_nb", 6, 2, False, True, True, False, False))
    assert [r[0] for r in results] == ["DataLoaderShard", "DataLoaderShard"]
    assert [r[4] for r in results] == [1, 1]  # every process read the stream


def _train(library):
    """A few SGD steps on a dispatched iterable dataset: the final weights."""
    lib = importlib.import_module(library)
    importlib.import_module(f"{library}.utils").set_seed(0)
    acc = lib.Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Stream(10), batch_size=2)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    for _ in range(2):
        for x, extra in loader:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), extra["y"].float())
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    return [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


def test_training_on_a_dispatched_stream_equals_the_reference():
    ours = run_ranks(_train, world_size=2, args=("accel_nb",))
    theirs = run_ranks(_train, world_size=2, args=("accelerate",))
    for a, b in zip(ours, theirs):
        for p, q in zip(a, b):
            assert torch.allclose(p, q, atol=1e-6)


def test_skip_data_loader_equals_the_reference():
    from accelerate.data_loader import SkipDataLoader as Reference

    from accel_nb.data_loader import SkipDataLoader

    for skip in (0, 2, 5):
        ours = SkipDataLoader(torch.arange(10), skip_batches=skip, batch_size=3)
        theirs = Reference(torch.arange(10), skip_batches=skip, batch_size=3)
        assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
        if skip <= 4:
            assert len(ours) == len(theirs)
        else:  # the reference's __len__ goes negative (len() raises); here it is 0
            assert len(ours) == 0


def test_use_stateful_dataloader_needs_torchdata():
    # the full behaviour (resumption, save_state, the reference side by side) is tests/test_data_stateful.py
    from accel_nb import Accelerator
    from accel_nb.utils import DataLoaderConfiguration

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    try:
        import torchdata.stateful_dataloader  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="torchdata"):
            acc.prepare(DataLoader(torch.arange(4), batch_size=2))
        return
    loader = acc.prepare(DataLoader(torch.arange(4), batch_size=2))
    assert type(loader.base_dataloader).__name__ == "StatefulDataLoader"
