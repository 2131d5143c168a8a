"""Training with accel_nb gives the same model as plain single-process training:
2 processes x batch B == 1 process x batch 2B; accumulation 4 x B == batch 4B; DDP talks only on
sync steps; the migration example differs from plain PyTorch in at most 5 lines and runs."""

from __future__ import annotations

import difflib
import importlib.util
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_nb.accelerator import Accelerator
from accel_nb.state import _reset_all_states
from accel_nb.utils import set_seed
from tests.dist_helpers import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


def _data(n=64):
    g = torch.Generator().manual_seed(123)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.linspace(-1, 1, 6).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def _model():
    set_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _weights(model):
    # numpy copies: tensors sent back through run_ranks' queue would travel as shared-memory handles
    # that vanish when the rank exits
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _train(batch_size, epochs=2, accumulation=1, shuffle=False, n=64):
    """The accel_nb loop; runs on however many ranks the environment describes."""
    acc = Accelerator(gradient_accumulation_steps=accumulation)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(7) if shuffle else None
    dl = DataLoader(_data(n), batch_size=batch_size, shuffle=shuffle, generator=generator)
    model, opt, dl = acc.prepare(model, opt, dl)
    for _ in range(epochs):
        for x, y in dl:
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
    return _weights(acc.unwrap_model(model))


def _train_plain(batch_size, epochs=2, n=64):
    """The same loop in plain PyTorch, one process."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for x, y in DataLoader(_data(n), batch_size=batch_size):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return _weights(model)


def _assert_close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        x, y = torch.from_numpy(a[k]), torch.from_numpy(b[k])
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4), (k, (x - y).abs().max())


def _assert_different(a, b):
    assert any(not torch.allclose(torch.from_numpy(a[k]), torch.from_numpy(b[k]), atol=1e-5) for k in a)


@pytest.mark.multiproc
def test_two_processes_batch_b_equal_one_process_batch_2b():
    two = run_ranks(_train, 2, args=(4,))
    _assert_close(two[0], two[1])  # DDP keeps the replicas identical
    _assert_close(two[0], _train_plain(8))
    _assert_different(two[0], _train_plain(4))  # the comparison can tell batch sizes apart


@pytest.mark.multiproc
def test_two_processes_equal_one_process_with_shuffling():
    # with a seeded generator on the DataLoader both runs shuffle in plain PyTorch's order (the 2 ranks
    # copy rank 0's generator at each pass and take alternate batches of one permutation)
    two = run_ranks(_train, 2, args=(4, 2, 1, True))
    one = run_ranks(_train, 1, args=(8, 2, 1, True))
    _assert_close(two[0], one[0])
    _assert_different(two[0], _train_plain(8))  # the shuffle really changed the order


def test_accumulation_of_4_batches_of_b_equals_one_batch_of_4b():
    accumulated = _train(2, accumulation=4)
    _reset_all_states()
    _assert_close(accumulated, _train(8))
    _assert_close(accumulated, _train_plain(8))
    _assert_different(accumulated, _train_plain(2))


def _accumulate_with_comm_hook(accumulation, n, batch_size):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    acc = Accelerator(gradient_accumulation_steps=accumulation)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, dl = acc.prepare(model, opt, DataLoader(_data(n), batch_size=batch_size))
    comms = []
    step = [0]

    def counting_hook(state, bucket):
        comms.append(step[0])
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    synced = []
    inner = acc.unwrap_model(model)
    for i, (x, y) in enumerate(dl, start=1):
        step[0] = i
        with acc.accumulate(inner if i % 2 else model):  # the inner module works as well as the wrapper
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            if acc.sync_gradients:
                synced.append(i)
            opt.step()
            opt.zero_grad()
    return {
        "comms": sorted(set(comms)),
        "synced": synced,
        "batches": len(dl),
        "w": _weights(acc.unwrap_model(model)),
    }


@pytest.mark.multiproc
def test_ddp_communicates_only_on_sync_steps():
    # 40 samples, 2 ranks x batch 2 -> 10 batches per rank; accumulate 4: sync at 4, 8 and the last (10)
    for res in run_ranks(_accumulate_with_comm_hook, 2, args=(4, 40, 2)):
        assert res["batches"] == 10
        assert res["comms"] == [4, 8, 10] and res["synced"] == [4, 8, 10]


@pytest.mark.multiproc
def test_two_processes_with_accumulation_equal_one_big_batch():
    # 64 samples, 2 ranks x batch 2 x 4 accumulation = 16 samples per update, 4 updates per epoch
    two = run_ranks(_accumulate_with_comm_hook, 2, args=(4, 64, 2))
    _assert_close(two[0]["w"], two[1]["w"])
    _assert_close(two[0]["w"], _train_plain(16, epochs=1))


# -- migration example ---------------------------------------------------------------------------------
def _read(name):
    with open(os.path.join(ROOT, "examples", name)) as f:
        return f.read().splitlines()


def _changed_lines(before, after):
    """Lines that differ: a replaced block counts its longer side, insertions and deletions their size."""
    ops = difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def test_migration_example_differs_in_at_most_5_lines():
    before, after = _read("migrate_before.py"), _read("migrate_after.py")
    changed = _changed_lines(before, after)
    assert 0 < changed <= 5, "\n".join(difflib.unified_diff(before, after, lineterm=""))
    with open(os.path.join(ROOT, "docs", "migration.md")) as f:
        page = f.read()
    diff = [
        line
        for line in difflib.unified_diff(before, after, lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    for line in diff:  # the page shows every changed line
        assert line[1:].strip() in page, line


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(ROOT, "examples", name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_migrated_example():
    return _load_example("migrate_after.py").main(epochs=2)


@pytest.mark.multiproc
def test_migration_example_trains_on_one_and_two_processes():
    single = run_ranks(_run_migrated_example, 1)[0]
    double = run_ranks(_run_migrated_example, 2)
    # the last batch's loss, well under an untrained model's ln 2 = 0.69 (its value depends on the shuffle)
    assert single < 0.5 and all(loss < 0.5 for loss in double)
