"""DataLoaderConfiguration(use_stateful_dataloader=True): the prepared loader iterates torchdata's
StatefulDataLoader and resumes mid-epoch exactly, on 1 and 2 real gloo ranks, through
state_dict()/load_state_dict() and save_state/load_state -- side by side with accelerate."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.dist_helpers import run_ranks

pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = pytest.mark.filterwarnings("ignore:.*set_vital.*:UserWarning")

N_ITEMS, BATCH = 22, 3


def _accelerator(library, seedable):
    utils = importlib.import_module(f"{library}.utils")
    utils.set_seed(3)
    config = utils.DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=seedable)
    return importlib.import_module(library).Accelerator(cpu=True, dataloader_config=config)


def _loader(acc, num_workers=0):
    generator = torch.Generator().manual_seed(5)
    data = DataLoader(
        list(range(N_ITEMS)), batch_size=BATCH, shuffle=True, generator=generator, num_workers=num_workers
    )
    return acc.prepare(data)


def _ids(loader):
    return [batch.tolist() for batch in loader]


def _resume(library, seedable, num_workers, epochs_before, stop_after):
    """Per rank: an uninterrupted pass, and the same pass cut after ``stop_after`` batches and resumed
    from ``state_dict()`` in a freshly prepared loader."""
    acc = _accelerator(library, seedable)
    whole = _loader(acc, num_workers)
    for _ in range(epochs_before):
        _ids(whole)
    full = _ids(whole)
    cut = _loader(acc, num_workers)
    for _ in range(epochs_before):
        _ids(cut)
    it = iter(cut)
    first = [next(it).tolist() for _ in range(stop_after)]
    state = cut.state_dict()
    del it
    fresh = _loader(acc, num_workers)
    fresh.load_state_dict(state)
    rest = _ids(fresh)
    base = type(getattr(fresh, "base_dataloader", None))
    return f"{base.__module__}.{base.__name__}", full, first, rest


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("seedable", [False, True])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_mid_epoch_resume_gives_the_remaining_batches_of_an_uninterrupted_pass(world, seedable, num_workers):
    results = run_ranks(_resume, world_size=world, args=("accel_nb", seedable, num_workers, 1, 2))
    for base, full, first, rest in results:
        assert base == "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader"
        assert len(first) == 2 and first + rest == full
    assert {i for _, full, _, _ in results for batch in full for i in batch} == set(range(N_ITEMS))


@pytest.mark.multiproc
@pytest.mark.parametrize("world", [1, 2])
def test_resume_equals_the_reference(world):
    # a seeded sampler is where the reference resumes exactly; with a plain RandomSampler and a
    # fresh loader it restarts the shuffle (accel_nb resumes that case too, tested above)
    args = (True, 0, 0, 3)
    ours = run_ranks(_resume, world_size=world, args=("accel_nb", *args))
    theirs = run_ranks(_resume, world_size=world, args=("accelerate", *args))
    for (base_a, *a), (base_b, *b) in zip(ours, theirs):
        assert base_a == base_b
        assert a == b


def test_the_prepared_loader_iterates_the_stateful_dataloader():
    from torchdata.stateful_dataloader import StatefulDataLoader

    from accel_nb.state import _reset_all_states

    _reset_all_states()
    acc = _accelerator("accel_nb", False)
    loader = _loader(acc)
    plain = (
        importlib.import_module("accel_nb")
        .Accelerator(cpu=True)
        .prepare(
            DataLoader(
                list(range(N_ITEMS)),
                batch_size=BATCH,
                shuffle=True,
                generator=torch.Generator().manual_seed(5),
            )
        )
    )
    assert isinstance(loader.base_dataloader, StatefulDataLoader)
    assert loader.base_dataloader._iterator is None
    assert _ids(loader) == _ids(plain)  # same batches as without the option
    assert loader.base_dataloader._iterator is not None  # torchdata's iterator made them
    _reset_all_states()


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(float(N_ITEMS)).split(1))


def _dispatched(stateful):
    from accel_nb import Accelerator
    from accel_nb.utils import DataLoaderConfiguration

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful))
    loader = acc.prepare(DataLoader(Stream(), batch_size=BATCH))
    it = iter(loader)
    first = [next(it).flatten().tolist() for _ in range(2)]
    state = loader.state_dict()
    del it
    fresh = acc.prepare(DataLoader(Stream(), batch_size=BATCH))
    fresh.load_state_dict(state)
    return (
        type(loader).__name__,
        type(loader.base_dataloader).__name__,
        first,
        [b.flatten().tolist() for b in fresh],
    )


@pytest.mark.multiproc
def test_dispatched_iterable_loader_reads_through_the_stateful_dataloader_and_resumes():
    ours = run_ranks(_dispatched, world_size=2, args=(True,))
    plain = run_ranks(_dispatched, world_size=2, args=(False,))
    for (kind, base, first, rest), (_, _, p_first, p_rest) in zip(ours, plain):
        assert (kind, base) == ("DataLoaderDispatcher", "StatefulDataLoader")
        assert first == p_first and rest == p_rest and len(rest) > 0


def _checkpoint_round_trip(path):
    import torch.nn as nn

    acc = _accelerator("accel_nb", False)
    model = nn.Linear(1, 1)
    model, loader = acc.prepare(model, _loader(acc))
    _ids(loader)  # epoch 0
    it = iter(loader)
    first = [next(it).tolist() for _ in range(2)]
    acc.save_state(path)
    rest = [b.tolist() for b in it]
    acc.load_state(path)
    assert loader.state_dict()["batches_yielded"] == 2
    resumed = _ids(loader)
    return first, rest, resumed


@pytest.mark.multiproc
def test_save_state_and_load_state_carry_the_position(tmp_path):
    results = run_ranks(_checkpoint_round_trip, world_size=2, args=(str(tmp_path / "ckpt"),))
    for first, rest, resumed in results:
        assert len(first) == 2 and len(rest) > 0
        assert resumed == rest


def test_without_torchdata_the_error_names_it():
    script = (
        "import sys; sys.modules['torchdata'] = None\n"  # as if torchdata were not installed
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from accel_nb import Accelerator\n"
        "from accel_nb.utils import DataLoaderConfiguration\n"
        "acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))\n"
        "try:\n"
        "    acc.prepare(DataLoader(torch.arange(4), batch_size=2))\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert "ImportError:" in out.stdout and "pip install torchdata" in out.stdout


def test_persistent_workers_give_the_plain_loaders_epochs():
    from accel_nb import Accelerator
    from accel_nb.state import _reset_all_states
    from accel_nb.utils import DataLoaderConfiguration

    def epochs(stateful):
        _reset_all_states()
        acc = Accelerator(
            cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful)
        )
        data = DataLoader(
            list(range(N_ITEMS)),
            batch_size=BATCH,
            shuffle=True,
            num_workers=1,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(7),
        )
        loader = acc.prepare(data)
        return [_ids(loader) for _ in range(3)]

    ours, plain = epochs(True), epochs(False)
    _reset_all_states()
    assert ours == plain and ours[0] != ours[1]
