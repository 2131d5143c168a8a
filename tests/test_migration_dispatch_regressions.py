"""The two regressions of the data-dispatch change, side by side with the reference on 2 gloo ranks:
an iterable loader with ``batch_size=None`` is prepared (each item one batch, split across processes
with ``split_batches=True``)
and a string in a batch reaches every process whole."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc


@pytest.fixture(autouse=True)
def _reference_state_does_not_leak():
    """The reference's shared state a test makes here must not reach later tests' forked ranks."""
    yield
    import accelerate.state

    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerate.state.GradientState._reset_state()


class Items(IterableDataset):
    """Items that are already batches: a tensor with a batch dimension and a string."""

    def __init__(self, n, rows, tagged=True):
        self.n, self.rows, self.tagged = n, rows, tagged

    def __iter__(self):
        for i in range(self.n):
            item = {"x": torch.arange(self.rows) + 10 * i, "y": torch.full((self.rows, 2), float(i))}
            yield {**item, "tag": "non_tensor_value", "k": i} if self.tagged else item


def _collate_with_string(samples):
    return {"x": torch.stack([s["x"] for s in samples]), "tag": "non_tensor_value"}


def _epoch(library, batch_size, collate):
    if library == "accelerate":  # a state the parent process made must not decide this rank's view
        import accelerate.state

        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
        accelerate.state.GradientState._reset_state()
    utils = importlib.import_module(f"{library}.utils")
    # the reference joins strings of several batches only when split_batches=True, and splits
    # unbatched items only when it is False
    config = utils.DataLoaderConfiguration(split_batches=batch_size is not None)
    acc = importlib.import_module(library).Accelerator(cpu=True, dataloader_config=config)
    dataset = Items(5, 2, tagged=False) if batch_size is None else Items(4, 1)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    prepared = acc.prepare(loader)
    out = []
    for batch in prepared:
        out.append({k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()})
    return type(prepared).__name__, out


def test_an_iterable_loader_with_batch_size_none_is_split_like_the_reference():
    ours = run_ranks(_epoch, world_size=2, args=("accel_nb", None, None))
    theirs = run_ranks(_epoch, world_size=2, args=("accelerate", None, None))
    assert [o[1] for o in ours] == [t[1] for t in theirs]
    assert all(batches for _, batches in ours)


@pytest.mark.parametrize("batch_size", [4, 2])
def test_a_string_in_a_dispatched_batch_stays_whole_like_the_reference(batch_size):
    # the reference broadcasts no strings across processes, so its side of this is one process
    import accelerate.data_loader

    import accel_nb.data

    results = []
    for module in (accel_nb.data, accelerate.data_loader):
        loader = DataLoader(Items(4, 1), batch_size=batch_size, collate_fn=_collate_with_string)
        prepared = module.prepare_data_loader(
            loader, num_processes=1, process_index=0, dispatch_batches=True, put_on_device=True
        )
        assert type(prepared).__name__ == "DataLoaderDispatcher"
        results.append([(b["x"].tolist(), b["tag"]) for b in prepared])
    assert results[0] == results[1]
    assert all(tag == "non_tensor_value" for _, tag in results[0])


def test_iterable_loader_without_batching_in_one_process():
    from accel_nb.data import prepare_data_loader

    loader = prepare_data_loader(DataLoader(Items(3, 2), batch_size=None), num_processes=1, process_index=0)
    got = [(b["x"].tolist(), b["tag"], b["k"]) for b in loader]
    assert got == [
        ([0, 1], "non_tensor_value", 0),
        ([10, 11], "non_tensor_value", 1),
        ([20, 21], "non_tensor_value", 2),
    ]


def test_a_map_style_loader_without_batching_still_refuses_dispatch():
    from accel_nb.data import prepare_data_loader

    with pytest.raises(ValueError, match="batch_size is None over a map-style dataset"):
        prepare_data_loader(
            DataLoader([torch.zeros(2)] * 3, batch_size=None),
            num_processes=1,
            process_index=0,
            dispatch_batches=True,
            put_on_device=True,  # dispatching needs it (the default is off, as in the reference)
        )
