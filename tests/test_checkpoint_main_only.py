"""``save_state`` under ``if accelerator.is_main_process:`` (issue 38, item 1): code written for the reference
saves this way; accel_nb's save waited for ranks that never came (they were in ``wait_for_everyone``).

Now the main process writes the checkpoint alone where the state is all on it (one process, DDP),
and every rank resumes from it as with the reference; where each process holds a part (FSDP,
DeepSpeed, tensor parallelism) it is refused at once, on the calling rank, naming the rule.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from accel_nb.checkpoint.callers import main_process_guard
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.multiproc


def _data():
    """64 samples repeating 4: every batch of a rank is the same, so a loss depends on the model only
    (accel_nb resumes a loader mid-epoch, the reference from its start: a deliberate difference)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 4, generator=g).repeat(16, 1)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))


def _steps(acc, model, opt, loader, n):
    losses = []
    batches = iter(loader)
    for _ in range(n):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        losses.append(round(float(loss), 6))
    return losses


def _main_only_round_trip(library, folder):
    import warnings

    torch.manual_seed(0)
    acc = importlib.import_module(library).Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(_data(), batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    _steps(acc, model, opt, loader, 2)
    if acc.is_main_process:  # the reference's users' form
        acc.save_state(folder)
    acc.wait_for_everyone()
    after_save = _steps(acc, model, opt, loader, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acc.load_state(folder)
    after_load = _steps(acc, model, opt, loader, 3)
    said = [str(w.message) for w in caught if "keeps its random state" in str(w.message)]
    return after_save, after_load, sorted(os.listdir(folder)) if acc.is_main_process else None, said


def test_save_state_on_the_main_process_only_saves_and_every_rank_resumes_like_the_reference(tmp_path):
    ours = run_ranks(_main_only_round_trip, 2, args=("accel_nb", str(tmp_path / "ours")), timeout=180)
    theirs = run_ranks(_main_only_round_trip, 2, args=("accelerate", str(tmp_path / "theirs")), timeout=180)
    for rank in (0, 1):
        after_save, after_load, _, _ = ours[rank]
        assert after_load == after_save  # the model and optimizer came back on every rank
        assert after_save == theirs[rank][0] and after_load == theirs[rank][1]  # the reference's numbers
    files = ours[0][2]
    assert "rank_0.pt" in files and "rank_1.pt" not in files and "model.safetensors" in files
    assert any(f.endswith(".json") for f in files)  # the manifest: the checkpoint is complete
    assert ours[0][3] == [] and len(ours[1][3]) == 1  # rank 1 is told it keeps its random state
    # nothing half-written is left beside it
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")] == []


def _fsdp_main_only(folder):
    from accel_nb import Accelerator
    from accel_nb.fsdp import FSDPOptions
    from accel_nb.serialization import CheckpointError

    acc = Accelerator(cpu=True, fsdp=FSDPOptions())
    model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
    said = None
    if acc.is_main_process:
        try:
            acc.save_state(folder)
        except CheckpointError as exc:
            said = str(exc)
    acc.wait_for_everyone()  # rank 1 was here all along: rank 0 came back at once instead of waiting
    acc.save_state(folder)  # on every process: the way that works
    return said, os.path.isdir(folder), type(model).__name__


def test_save_state_on_the_main_process_only_with_fsdp_is_refused_at_once(tmp_path):
    results = run_ranks(_fsdp_main_only, 2, args=(str(tmp_path / "ckpt"),), timeout=180)
    said, saved, _ = results[0]
    assert said is not None and "called on one process only" in said, said
    assert "FSDP" in said and "on every process" in said and "Nothing was saved" in said
    assert "is_main_process" in said  # it names the block it found
    assert saved and results[1][0] is None


def _load_on_main_only(folder):
    from accel_nb import Accelerator
    from accel_nb.serialization import CheckpointError

    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(4, 1))
    acc.save_state(folder)
    said = None
    if acc.is_main_process:
        try:
            acc.load_state(folder)
        except CheckpointError as exc:
            said = str(exc)
    acc.wait_for_everyone()
    return said


def test_load_state_on_the_main_process_only_is_refused_at_once(tmp_path):
    said = run_ranks(_load_on_main_only, 2, args=(str(tmp_path / "ckpt"),), timeout=180)[0]
    assert said is not None and "load_state is called on one process only" in said, said
    assert "on every process" in said and "Nothing was loaded" in said


# -- reading the caller's code ------------------------------------------------------------------------
class _Probe:
    is_main_process = True
    is_local_main_process = True
    process_index = 0

    def on_main_process(self, fn):
        return fn


def _probe():
    return main_process_guard()


def _plain():
    return _probe()


def _guarded():
    acc = _Probe()
    if acc.is_main_process:
        return _probe()
    return None


def _negated_else():
    acc = _Probe()
    if not acc.is_main_process:
        return None
    else:
        return _probe()


def _by_index():
    acc = _Probe()
    if acc.process_index == 0:
        return _probe()
    return None


def _through_a_helper():
    acc = _Probe()
    if acc.is_local_main_process:
        return _plain()  # the guard is one frame out
    return None


_acc = _Probe()


@_acc.on_main_process
def _decorated():
    return _probe()


def _after_the_block():
    acc = _Probe()
    if acc.is_main_process:
        pass
    return _probe()  # not inside it


@pytest.mark.parametrize(
    "fn, found",
    [
        (_plain, None),
        (_guarded, "if acc.is_main_process:"),
        (_negated_else, "if not acc.is_main_process:"),
        (_by_index, "if acc.process_index == 0:"),
        (_through_a_helper, "if acc.is_local_main_process:"),
        (_decorated, "@...on_main_process"),
        (_after_the_block, None),
    ],
)
def test_the_main_process_block_is_read_from_the_callers_code(fn, found):
    said = fn()
    if found is None:
        assert said is None, said
    else:
        assert said is not None and said.startswith(found) and "test_checkpoint_main_only.py" in said, said
