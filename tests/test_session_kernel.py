"""Interactive sessions from a REAL Jupyter kernel: warm workers keep their state across cells.

The tests of this module share one kernel and run in order, as a user's notebook would: start,
build a model, train, evaluate, pull the metric, fail and fix, fail inside a collective,
interrupt, restart, stop. The last tests check that no worker outlives the kernel.
"""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from tests.kernel_helpers import KernelSession
from tests.process_helpers import assert_no_descendants, live_descendants

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc, pytest.mark.slow]


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run("%load_ext accel_nb", timeout=120)
        assert out.error is None, out.traceback
        out = k.run("%accelerate start -n 2 --cpu", timeout=180)
        assert out.error is None, out.traceback
        assert "session of 2 ranks (gloo, fork)" in out.stdout, out.text
        yield k


def _ok(out) -> str:
    assert out.error is None, out.traceback + out.text
    assert not out.timed_out
    return out.stdout + out.stderr


def _rank_pids(k: KernelSession) -> list[int]:
    return sorted(p.pid for p in live_descendants(psutil.Process(k.pid)))


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_model_built_trained_and_evaluated_in_three_cells_then_pulled(kernel):
    pids = _rank_pids(kernel)
    assert len(pids) == 2
    text = _ok(
        kernel.run(
            "%%accelerate\n"
            "import torch\n"
            "from accel_nb import Accelerator\n"
            "torch.manual_seed(0)\n"
            "accelerator = Accelerator()\n"
            "model = torch.nn.Linear(4, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"
            "x = torch.randn(64, 4); y = x.sum(1, keepdim=True)\n"
            "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)\n"
            "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "f'rank {accelerator.process_index} of {accelerator.num_processes}'\n"
        )
    )
    assert "[rank 0] 'rank 0 of 2'" in text and "[rank 1] 'rank 1 of 2'" in text, text
    text = _ok(
        kernel.run(
            "%%accelerate\n"
            "for xb, yb in loader:\n"
            "    loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
            "    accelerator.backward(loss); opt.step(); opt.zero_grad()\n"
            "round(accelerator.unwrap_model(model).weight.sum().item(), 5)\n"
        )
    )
    # DDP kept both replicas equal: one merged line for both ranks
    assert re.search(r"\[ranks 0,1\] -?\d", text), text
    text = _ok(
        kernel.run(
            "%%accelerate\n"
            "with torch.no_grad():\n"
            "    errs = torch.stack([torch.nn.functional.mse_loss(model(xb), yb) for xb, yb in loader])\n"
            "metric = accelerator.reduce(errs.mean(), 'mean').item()\n"
        )
    )
    text = _ok(
        kernel.run("%accelerate pull metric --rank 1\nprint('METRIC', type(metric).__name__, metric > 0)")
    )
    assert "metric copied from rank 1" in text and "METRIC float True" in text, text
    assert _rank_pids(kernel) == pids  # no new process was started for any of these cells


def test_status_shows_each_rank_pid_device_memory_and_state(kernel):
    out = kernel.run("%accelerate status")
    _ok(out)
    html = " ".join(str(c.get("data", {}).get("state", {}).get("value", "")) for c in out.comms)
    for pid in _rank_pids(kernel):
        assert str(pid) in html, html
    assert "idle" in html and "cpu" in html and re.search(r"\d ?[KMG]i?B", html), html


def test_wrong_use_of_the_verbs_and_flags_is_a_one_line_error(kernel):
    def usage(code: str) -> str:  # IPython prints a UsageError as one line on stderr
        out = kernel.run(code)
        assert "UsageError: " in out.stderr, out.text
        return out.stderr

    assert "cannot change while a session is running" in usage("%%accelerate -n 3\n1")
    assert "unknown verb 'launch'" in usage("%accelerate launch")
    assert "already running" in usage("%accelerate start -n 2")
    assert "no variable 'not_in_the_notebook'" in usage("%accelerate push not_in_the_notebook")
    out = kernel.run("%%accelerate --rank 7\n1")
    assert out.error["ename"] == "SessionError" and "rank 7 does not exist" in out.error["evalue"], out.text
    text = _ok(kernel.run("%%accelerate --rank 1\naccelerator.process_index"))
    assert "[rank 1] 1" in text and "[rank 0]" not in text, text


def test_a_cell_failing_on_rank_1_is_fixed_and_rerun_without_restart(kernel):
    out = kernel.run(
        "%%accelerate\n"
        "value = 40 + accelerator.process_index\n"
        "if accelerator.process_index == 1:\n"
        "    raise ValueError('boom on rank 1')\n"
    )
    assert out.error is not None and out.error["ename"] == "LaunchError", out.text
    assert "rank 1 (first to fail) failed: ValueError: boom on rank 1" in out.traceback
    assert "namespaces intact" in out.traceback
    text = _ok(
        kernel.run("%%accelerate\nvalue = 42 + accelerator.process_index\n(value, round(metric, 3) > 0)")
    )
    assert "[rank 0] (42, True)" in text and "[rank 1] (43, True)" in text, text


def test_rank_1_raising_while_rank_0_waits_in_all_reduce_returns_with_both_facts(kernel):
    out = kernel.run(
        "%%accelerate\n"
        "t = torch.ones(1)\n"
        "if accelerator.process_index == 1:\n"
        "    raise RuntimeError('rank 1 gave up')\n"
        "torch.distributed.all_reduce(t)\n",
        timeout=60,
    )
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "LaunchError", out.text
    tb = out.traceback
    assert "rank 1 (first to fail) failed: RuntimeError: rank 1 gave up" in tb
    assert "rank 0 was at" in tb and "all_reduce" in tb, tb
    assert "a fresh one was formed on the same workers" in tb, tb
    assert "[rank 0] Python stacks" in out.stderr and "all_reduce" in out.stderr, out.stderr
    # a fresh group on the same workers: collectives run again, the namespaces are kept; pull works
    text = _ok(
        kernel.run("%%accelerate\nt = torch.ones(1); torch.distributed.all_reduce(t); (t.item(), value)")
    )
    assert "[rank 0] (2.0, 42)" in text and "[rank 1] (2.0, 43)" in text, text
    text = _ok(kernel.run("%accelerate pull value --rank 1\nprint('VALUE', value)"))
    assert "VALUE 43" in text
    pids = _rank_pids(kernel)
    _ok(kernel.run("%accelerate restart", timeout=180))
    assert set(_rank_pids(kernel)).isdisjoint(pids)
    text = _ok(
        kernel.run(
            "%%accelerate\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
        )
    )
    assert "[ranks 0,1] 2.0" in text, text


def _interrupt_when(kernel: KernelSession, cell: str, marker: str):
    msg_id = kernel.kc.execute(cell)
    seen = kernel.wait_for_text(msg_id, marker, count=2, timeout=60)
    assert seen.count(marker) >= 2, seen
    time.sleep(0.3)  # both ranks are in the call that follows the print
    kernel.km.interrupt_kernel()
    return kernel.collect(msg_id, timeout=60)


def test_interrupt_of_a_sleeping_cell_reaches_every_rank_and_the_session_stays_usable(kernel):
    _ok(kernel.run("%%accelerate\nimport time\nkept = 7"))
    out = _interrupt_when(
        kernel,
        "%%accelerate\nprint('sleeping on', torch.distributed.get_rank(), flush=True)\ntime.sleep(120)\n",
        "sleeping on",
    )
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out.text
    assert "[rank 0] Python stacks (when stopped)" in out.stderr and "[rank 1] Python stacks" in out.stderr
    assert "<accelerate-cell-" in out.stderr, out.stderr
    for rank in (0, 1):  # raised in each rank's code, at the sleep (one merged line when both say the same)
        said = rf'\[(rank {rank}|ranks [\d,]*{rank}[\d,]*)\] stopped: KeyboardInterrupt at File "<accelerate-cell-\d+>", line 3'
        assert re.search(said, out.stderr), out.stderr
    assert "session is still usable" in out.error["evalue"], out.error
    text = _ok(
        kernel.run("%%accelerate\nt = torch.ones(1); torch.distributed.all_reduce(t); (kept, t.item())")
    )
    assert "[ranks 0,1] (7, 2.0)" in text, text


def test_interrupt_of_a_cell_stuck_in_a_collective_returns_with_a_fresh_group(kernel):
    out = _interrupt_when(
        kernel,
        "%%accelerate\n"
        "print('waiting on', torch.distributed.get_rank(), flush=True)\n"
        "if torch.distributed.get_rank() == 0:\n"
        "    torch.distributed.all_reduce(torch.ones(1))\n"
        "else:\n"
        "    time.sleep(120)\n",
        "waiting on",
    )
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out.text
    assert "[rank 0] Python stacks (when stopped)" in out.stderr and "all_reduce" in out.stderr, out.stderr
    assert "a fresh one was formed on the same workers" in out.error["evalue"], out.error
    text = _ok(kernel.run("%accelerate status"))
    _ok(kernel.run("%accelerate restart", timeout=180))
    text = _ok(
        kernel.run("%%accelerate\nimport torch\nt = torch.ones(1); torch.distributed.all_reduce(t); t.item()")
    )
    assert "[ranks 0,1] 2.0" in text, text


def test_stop_leaves_no_child_and_cells_launch_fresh_processes_again(kernel):
    pids = _rank_pids(kernel)
    assert len(pids) == 2
    _ok(kernel.run("%accelerate stop"))
    assert_no_descendants(psutil.Process(kernel.pid), within=5)
    text = _ok(kernel.run("%%accelerate -n 2 --cpu\nimport os\nos.getpid()"))
    assert "Launching 2 CPU processes" in text


def test_workers_die_when_the_kernel_restarts(kernel):
    _ok(kernel.run("%accelerate start -n 2 --cpu", timeout=180))
    pids = _rank_pids(kernel)
    assert len(pids) == 2
    kernel.km.restart_kernel(now=False)
    assert _gone(pids), [p for p in pids if psutil.pid_exists(p)]


def test_sigkill_of_the_kernel_leaves_no_orphan():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        _ok(k.run("%load_ext accel_nb\n%accelerate start -n 2 --cpu", timeout=180))
        pids = _rank_pids(k)
        assert len(pids) == 2
        os.kill(k.pid, signal.SIGKILL)
        assert _gone(pids), [p for p in pids if psutil.pid_exists(p)]


def test_widget_progress_and_no_leak_across_warm_cells():
    """In widget mode each session cell gets the launch's live view (a bar per rank); cells leak no fd or thread."""
    from tests.test_progress_kernel import _final, _models, _updates

    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:
        _ok(k.run("%load_ext accel_nb\n%accelerate start -n 2 --cpu", timeout=180))
        out = k.run(
            "%%accelerate\nfrom accel_nb import progress\nfor i in progress(range(5), desc='steps'):\n    pass\n"
        )
        _ok(out)
        bars = _models(out, "IntProgressModel")
        assert len(bars) == 2, "one bar per rank"
        for comm_id, opening in bars:
            final = _final(opening, _updates(out, comm_id))
            assert final["value"] == 5 and final["max"] == 5 and final["bar_style"] == "success", final
        count = (
            "import os, threading\n"
            "def _fds():\n"
            "    n = 0\n"
            "    for fd in os.listdir('/proc/self/fd'):\n"
            "        try:\n"
            "            os.readlink(f'/proc/self/fd/{fd}'); n += 1\n"
            "        except OSError:\n"
            "            pass\n"
            "    return n\n"
            "print('COUNT', _fds(), threading.active_count())"
        )

        def counts() -> tuple[int, int]:
            line = [ln for ln in _ok(k.run(count)).splitlines() if ln.startswith("COUNT")][-1]
            return int(line.split()[1]), int(line.split()[2])

        for _ in range(2):  # the display's first use opens what it keeps (comms, iopub sockets)
            _ok(k.run("%%accelerate\nx = 1"))
        before = counts()
        for _ in range(6):
            _ok(k.run("%%accelerate\nx = x + 1"))
        # nothing grows with the cells (a descriptor the kernel itself closes meanwhile may make it
        # smaller). ipykernel closes a finished publishing thread's pipe about 10 s after the thread
        # ends, so counts are read until they settle: a real leak stays after 30 s.
        deadline = time.monotonic() + 30
        after = counts()
        while not (after[0] <= before[0] and after[1] <= before[1]) and time.monotonic() < deadline:
            time.sleep(2)
            after = counts()
        assert after[0] <= before[0] and after[1] <= before[1], (
            f"(fds, threads) before {before}, after 6 cells {after}"
        )
        _ok(k.run("%accelerate stop"))
        assert_no_descendants(psutil.Process(k.pid), within=5)


def test_spawned_session_in_a_kernel_and_sigkill_leaves_no_orphan():
    """With spawn the ranks are children of the warm spawn server: they and the server die with the kernel."""
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        _ok(k.run("%load_ext accel_nb\n%accelerate start -n 2 --cpu --start_method spawn", timeout=180))
        text = _ok(
            k.run("%%accelerate\nimport os, torch.distributed as dist\n(dist.get_rank(), os.getppid() != 0)")
        )
        assert "[rank 0] (0, True)" in text and "[rank 1] (1, True)" in text, text
        everything = [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
        assert len(everything) >= 3  # the spawn server and its two ranks
        os.kill(k.pid, signal.SIGKILL)
        assert _gone(everything), [p for p in everything if psutil.pid_exists(p)]


def test_the_start_cells_view_follows_the_session_while_cells_run():
    """Issue 41.9: the start cell's rows said "ready (idle)" while a cell trained on the workers, and its
    "0 cells run" never changed. Now they say which cell runs, then idle again with the count."""
    import json

    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:  # the widget view in a kernel
        start = k.run("%load_ext accel_nb\n%accelerate start -n 2 --cpu", timeout=180)
        _ok(start)
        assert "0 cells run" not in start.text  # no count in a line that stays in the cell's output
        out = k.run("%%accelerate\nimport time\nx = 1\n", timeout=120)
        _ok(out)
        said = json.dumps(out.comms)  # the start view's models are updated from this cell
        # the cell is named after its In [N] prompt (In [1] started the session)
        assert "running cell 2 (its progress and output are in that cell)" in said, said[-2000:]
        assert "ready (idle, waiting for %%accelerate cells) | 1 cell run" in said, said[-2000:]
        out = k.run("%%accelerate\ny = x + 1\n", timeout=120)
        assert "running cell 3" in json.dumps(out.comms) and "| 2 cells run" in json.dumps(out.comms)
        _ok(k.run("%accelerate stop", timeout=120))
