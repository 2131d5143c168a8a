"""Behaviour a renamed script sees, side by side with accelerate (issue 19's list of differences).

Each test runs the same few lines under both libraries and asserts the same result. Where
accel_nb still differs, the test is a strict xfail whose reason names the core change that fixes
it: when the change lands the test passes, strict xfail turns that into a failure, and the marker
comes off.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")

LIBRARIES = ("accel_nb", "accelerate")


def _side_by_side(fn, world_size=2, *args):
    return [run_ranks(fn, world_size=world_size, args=(library, *args)) for library in LIBRARIES]


# -- shuffling with the user's seeded generator ------------------------------------------------------
def _shuffled_batches(library, per_process_batch):
    accelerator = importlib.import_module(library).Accelerator(cpu=True)
    generator = torch.Generator().manual_seed(42)
    loader = DataLoader(list(range(24)), batch_size=per_process_batch, shuffle=True, generator=generator)
    loader = accelerator.prepare(loader)
    epochs = []
    for epoch in range(2):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        epochs.append([batch.tolist() for batch in loader])
    return epochs


def _steps_as_one_process(per_rank):
    """Concatenate the ranks' batches step by step: what one process with the doubled batch sees."""
    return [[r0 + r1 for r0, r1 in zip(*epoch, strict=True)] for epoch in zip(*per_rank, strict=True)]


@pytest.mark.multiproc
def test_two_processes_see_the_batches_of_one_process_with_the_doubled_batch():
    results = {}
    for library in LIBRARIES:
        two = _steps_as_one_process(run_ranks(_shuffled_batches, world_size=2, args=(library, 3)))
        one = run_ranks(_shuffled_batches, world_size=1, args=(library, 6))[0]
        results[library] = (two, one)
    ref_two, ref_one = results["accelerate"]
    assert ref_two == ref_one  # the reference's documented behaviour
    ours_two, ours_one = results["accel_nb"]
    assert ours_two == ours_one


def _plain_pytorch_order(batch_size):
    generator = torch.Generator().manual_seed(42)
    loader = DataLoader(list(range(24)), batch_size=batch_size, shuffle=True, generator=generator)
    return [[batch.tolist() for batch in loader] for _ in range(2)]


@pytest.mark.multiproc
def test_a_seeded_generator_shuffles_as_plain_pytorch_and_the_reference():
    plain = _plain_pytorch_order(6)
    assert run_ranks(_shuffled_batches, world_size=1, args=("accelerate", 6))[0] == plain
    assert run_ranks(_shuffled_batches, world_size=1, args=("accel_nb", 6))[0] == plain


# -- preparing twice -----------------------------------------------------------------------------------
def _prepare_twice(library):
    accelerator = importlib.import_module(library).Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(list(range(8)), batch_size=2)
    first = accelerator.prepare(model, optimizer, loader)
    try:
        second = accelerator.prepare(*first)
    except Exception as exc:  # noqa: BLE001 - the outcome is compared
        return type(exc).__name__
    return [a is b for a, b in zip(first, second, strict=True)]


@pytest.mark.multiproc
def test_preparing_prepared_objects_returns_them():
    ours, theirs = _side_by_side(_prepare_twice)
    assert theirs == [[True, True, True]] * 2
    assert ours == theirs


# -- reduce --------------------------------------------------------------------------------------------
def _reductions(library):
    importlib.import_module(library).PartialState(cpu=True)
    reduce = importlib.import_module(f"{library}.utils").reduce
    rank = torch.distributed.get_rank()
    value = torch.tensor([rank + 1.0, 4.0 - rank])
    out = {}
    for reduction in ("sum", "mean", "max", "min", "product"):
        try:
            out[reduction] = reduce(value, reduction).tolist()
        except Exception as exc:  # noqa: BLE001
            out[reduction] = type(exc).__name__
    out["default"] = reduce(value).tolist()
    return out


@pytest.mark.multiproc
def test_reduce_operations_are_those_of_the_reference():
    ours, theirs = _side_by_side(_reductions)
    assert theirs[0]["sum"] == [3.0, 7.0] and theirs[0]["max"] == [2.0, 4.0]
    # accelerate.utils.reduce averages by default (Accelerator.reduce sums): accel_nb.utils.reduce too
    assert ours[0]["default"] == theirs[0]["default"] == [1.5, 3.5]
    for reduction in ("sum", "mean", "max"):
        assert ours[0][reduction] == theirs[0][reduction], (reduction, ours[0], theirs[0])
    assert ours[0]["min"] == [1.0, 3.0] and ours[0]["product"] == [2.0, 12.0]


# -- set_epoch through a custom batch sampler ----------------------------------------------------------
class EpochSampler(SequentialSampler):
    """A sampler that remembers the epoch it was given."""

    epoch = -1

    def set_epoch(self, epoch):
        self.epoch = epoch


def _epoch_reaches_sampler(library):
    accelerator = importlib.import_module(library).Accelerator(cpu=True)
    sampler = EpochSampler(list(range(8)))
    loader = accelerator.prepare(DataLoader(list(range(8)), batch_sampler=BatchSampler(sampler, 2, False)))
    loader.set_epoch(3)
    list(loader)
    return sampler.epoch


@pytest.mark.multiproc
def test_set_epoch_reaches_the_sampler_inside_a_custom_batch_sampler():
    ours, theirs = _side_by_side(_epoch_reaches_sampler)
    assert theirs == [3, 3]
    assert ours == theirs


# -- BatchSamplerShard --------------------------------------------------------------------------------
SHARD_CASES = [
    (n, batch, drop_last, split, even)
    for n in (7, 8, 10, 13)
    for batch in (2, 4)
    for drop_last in (False, True)
    for split in (False, True)
    for even in (True, False)
]


def _shards(library, batch_sampler, split, even):
    shard = importlib.import_module(f"{library}.data_loader").BatchSamplerShard
    out = []
    for rank in range(2):
        try:
            out.append(
                list(
                    shard(
                        batch_sampler,
                        num_processes=2,
                        process_index=rank,
                        split_batches=split,
                        even_batches=even,
                    )
                )
            )
        except Exception as exc:  # noqa: BLE001
            out.append(type(exc).__name__)
    return out


def test_batch_sampler_shard_splits_like_the_reference():
    differ = []
    for n, batch, drop_last, split, even in SHARD_CASES:
        sampler = BatchSampler(SequentialSampler(range(n)), batch, drop_last)
        ours, theirs = (_shards(lib, sampler, split, even) for lib in LIBRARIES)
        if ours != theirs:
            differ.append(((n, batch, drop_last, split, even), ours, theirs))
    lines = "\n".join(
        f"(n, batch, drop_last, split, even)={c}: accel_nb {o} reference {t}" for c, o, t in differ
    )
    assert not differ, f"{len(differ)} BatchSamplerShard case(s) differ:\n{lines}"


def test_batch_sampler_shard_of_a_list_of_lists_like_the_reference():
    batches = [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9, 10], [11]]
    results = {}
    for library in LIBRARIES:
        results[library] = {
            (s, e): _shards(library, batches, s, e) for s in (False, True) for e in (True, False)
        }
    assert results["accel_nb"] == results["accelerate"]


# -- init_empty_weights(include_buffers=True) -----------------------------------------------------------
def test_init_empty_weights_with_buffers_puts_plain_tensors_on_meta():
    devices = {}
    for library in LIBRARIES:
        with importlib.import_module(library).init_empty_weights(include_buffers=True):
            plain = torch.ones(3)
            layer = nn.Linear(2, 2)
        devices[library] = (plain.device.type, layer.weight.device.type)
    assert devices["accelerate"] == ("meta", "meta")
    assert devices["accel_nb"] == devices["accelerate"]


# -- save_model of a disk-offloaded model ---------------------------------------------------------------
def _save_offloaded(library, folder):
    module = importlib.import_module(library)
    accelerator = module.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    module.disk_offload(model, f"{folder}/{library}-offload", execution_device="cpu")
    try:
        accelerator.save_model(model, f"{folder}/{library}-saved")
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__
    from safetensors.torch import load_file

    saved = load_file(f"{folder}/{library}-saved/model.safetensors")
    return sorted(saved) == sorted(expected) and all(torch.equal(saved[k], expected[k]) for k in expected)


@pytest.mark.multiproc
def test_save_model_writes_a_disk_offloaded_model(tmp_path):
    ours, theirs = _side_by_side(_save_offloaded, 1, str(tmp_path))
    assert theirs == [True]
    assert ours == theirs


# -- infer_auto_device_map on several GPUs --------------------------------------------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(100, 100)

    def forward(self, x):
        return self.linear(x)


def test_device_map_collapses_to_one_gpu_when_everything_fits():
    model = nn.Sequential(*[Block() for _ in range(4)])
    budgets = {0: 10**6, 1: 10**6, "cpu": 10**7}  # budgets only: no GPU is touched
    maps = {
        library: dict(
            importlib.import_module(library).infer_auto_device_map(
                model, max_memory=budgets, no_split_module_classes=["Block"]
            )
        )
        for library in LIBRARIES
    }
    assert maps["accelerate"] == {"": 0}
    assert maps["accel_nb"] == maps["accelerate"]


# -- split_between_processes of a datasets.Dataset -------------------------------------------------------
def _split_dataset(library):
    import datasets

    state = importlib.import_module(library).PartialState(cpu=True)
    data = datasets.Dataset.from_dict({"x": list(range(5))})
    with state.split_between_processes(data) as part:
        return type(part).__name__, list(part["x"])


@pytest.mark.multiproc
def test_split_between_processes_of_a_dataset_gives_a_dataset():
    pytest.importorskip("datasets")
    ours, theirs = _side_by_side(_split_dataset)
    assert ours == theirs
