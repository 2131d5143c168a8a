"""A session keeps its workers and namespaces when a collective breaks, in a REAL kernel (2 gloo ranks).

A collective that is interrupted (rank 0 in ``all_reduce`` while rank 1 sleeps) or broken by a
rank's exception (rank 0 raises while rank 1 waits in ``all_reduce``) is freed by closing the
group's links; the session then forms a fresh group (a new store on a new port) on the same
workers. The next cells run an ``all_reduce`` and a DDP training step on the model built before,
and the DDP model was re-bound to the new group (its gradients are averaged: the replicas stay
equal although each rank trains on its own data). A process group the user kept in a variable is
named as bound to the old group, in the cell's message and in ``%accelerate status``.

The interrupt is sent only once each rank's own stacks show it in the line the test is about. A rank
blocked in the collective is freed without waiting out the grace given to a rank in Python code
(that grace is made an hour long in the interrupt test, so the cell returns only by that path).
"""

from __future__ import annotations

import re

import psutil
import pytest

from tests.kernel_helpers import KernelSession
from tests.process_helpers import live_descendants
from tests.test_session_interrupt_kernel import _session_ranks, _wait_until_stacks_show

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc, pytest.mark.slow]

LOAD_MODEL = (
    "%%accelerate\n"
    "import time, torch, torch.distributed as dist\n"
    "from accel_nb import Accelerator\n"
    "torch.manual_seed(0)\n"
    "accelerator = Accelerator()\n"
    "model = torch.nn.Linear(4, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, opt = accelerator.prepare(model, opt)\n"
    "g = torch.Generator().manual_seed(100 + accelerator.process_index)  # each rank its own data\n"
    "loaded_at = round(accelerator.unwrap_model(model).weight.sum().item(), 6)\n"
    "loaded_at\n"
)

TRAIN_STEP = (
    "%%accelerate\n"
    "x = torch.randn(16, 4, generator=g)\n"
    "loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))\n"
    "accelerator.backward(loss); opt.step(); opt.zero_grad()\n"
    "w = accelerator.unwrap_model(model).weight.sum().item()\n"
    "(round(w, 6), w != loaded_at)\n"
)


@pytest.fixture
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run("%load_ext accel_nb", timeout=120)
        assert out.error is None, out.traceback
        out = k.run("%accelerate start -n 2 --cpu", timeout=180)
        assert out.error is None, out.traceback
        yield k
        k.run("%accelerate stop", timeout=60)


def _ok(out) -> str:
    assert out.error is None, out.traceback + out.text
    assert not out.timed_out
    return out.stdout + out.stderr


def _rank_pids(k: KernelSession) -> list[int]:
    return sorted(p.pid for p in live_descendants(psutil.Process(k.pid)))


def _status(k: KernelSession) -> str:
    return _ok(
        k.run(
            "from accel_nb.notebook.session_view import status_text\n"
            "from accel_nb.notebook.session_magics import active_session\n"
            "print(status_text(active_session()))"
        )
    )


def _collectives_and_training_work_on_the_same_workers(k: KernelSession, pids: list[int]) -> None:
    text = _ok(
        k.run(
            "%%accelerate\nt = torch.ones(1); dist.all_reduce(t); (t.item(), dist.get_world_size(), accelerator.num_processes)"
        )
    )
    assert "[ranks 0,1] (2.0, 2, 2)" in text, text
    text = _ok(k.run("%%accelerate\n(accelerator.process_index, dist.get_rank(), loaded_at == loaded_at)"))
    assert "[rank 0] (0, 0, True)" in text and "[rank 1] (1, 1, True)" in text, text
    text = _ok(k.run(TRAIN_STEP))
    # different data on each rank, yet one merged line: the gradients were averaged over the new group
    assert re.search(r"\[ranks 0,1\] \(-?\d+\.\d+, True\)", text), text
    assert _rank_pids(k) == pids  # the same workers: no restart


def test_interrupting_a_cell_stuck_in_all_reduce_keeps_the_model_and_gives_a_fresh_group(kernel):
    loaded = _ok(kernel.run(LOAD_MODEL))
    assert re.search(r"\[ranks 0,1\] -?\d", loaded), loaded
    # a rank whose stacks show it blocked in all_reduce cannot take SIGINT: the group is closed under it
    # without waiting out the grace a rank in Python code gets (made an hour here: the cell could not
    # return within the collect below if the supervisor waited for it)
    _ok(kernel.run("import accel_nb.launch.session.cell_supervisor as _cs\n_cs.INTERRUPT_GRACE_S = 3600.0"))
    pids = _rank_pids(kernel)
    log_dir, rank_pids = _session_ranks(kernel)
    msg_id = kernel.kc.execute(
        "%%accelerate\n"
        "if dist.get_rank() == 0:\n"
        "    dist.all_reduce(torch.ones(1))\n"
        "else:\n"
        "    time.sleep(300)\n"
    )
    _wait_until_stacks_show(log_dir, rank_pids, {0: "in all_reduce", 1: "line 5 in <module>"})
    kernel.km.interrupt_kernel()
    out = kernel.collect(msg_id, timeout=120)
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out.text
    note = out.error["evalue"]
    assert (
        "rank 0 (in all_reduce) did not stop at the interrupt and was freed by closing the process group"
        in note
    )
    assert "a fresh one was formed on the same workers: their namespaces are kept" in note, note
    assert "model (DistributedDataParallel) on ranks 0,1 now synchronise over the new group" in note, note
    assert "restart" not in note and "broken (" in note, note
    status = _status(kernel)
    assert "BROKEN" not in status and "process group broken" not in status, status
    assert (
        "re-bound to the re-formed process group: model (DistributedDataParallel) on ranks 0,1" in status
    ), status
    _collectives_and_training_work_on_the_same_workers(kernel, pids)


def test_a_collective_broken_by_a_rank_exception_keeps_the_model_and_names_what_holds_the_old_group(kernel):
    _ok(kernel.run(LOAD_MODEL))
    _ok(
        kernel.run(
            "%%accelerate\nkept_group = dist.new_group([0, 1])\nt = torch.ones(1); dist.all_reduce(t, group=kept_group)"
        )
    )
    pids = _rank_pids(kernel)
    out = kernel.run(
        "%%accelerate\n"
        "t = torch.ones(1)\n"
        "if dist.get_rank() == 0:\n"
        "    raise RuntimeError('rank 0 gave up')\n"
        "dist.all_reduce(t)\n",
        timeout=120,
    )
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "LaunchError", out.text
    tb = out.traceback
    assert "rank 0 (first to fail) failed: RuntimeError: rank 0 gave up" in tb, tb
    assert "rank 1 was at" in tb and "all_reduce" in tb, tb
    assert "a fresh one was formed on the same workers: their namespaces are kept" in tb, tb
    assert "model (DistributedDataParallel) on ranks 0,1 now synchronise over the new group" in tb, tb
    stale = "still bound to the old process group (it would fail or hang): kept_group (a process group of the old group) on ranks 0,1"
    assert stale in tb and "Build them again and prepare them" in tb, tb
    assert stale in _status(kernel)
    _collectives_and_training_work_on_the_same_workers(kernel, pids)
    # the old group is still named until the cell that drops it
    assert stale in _status(kernel)
    _ok(kernel.run("%%accelerate\ndel kept_group"))
    assert "still bound" not in _status(kernel)
