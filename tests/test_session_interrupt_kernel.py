"""What a user is told when a session cell is interrupted, in a REAL kernel: the right ranks, the cell's
lines, the right state in ``%accelerate status``, a traceback without accel_nb's frames, and what
``%accelerate stop`` did.

The interrupt is sent only once each rank's own stacks (faulthandler, asked here with the launcher's
stack signal) show it in the line the test is about: a condition, not a pause.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from accel_nb.launch.rank.worker import STACKS_SIGNAL, stacks_path
from tests.kernel_helpers import KernelSession

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc, pytest.mark.slow]


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run("%load_ext accel_nb", timeout=120)
        assert out.error is None, out.traceback
        out = k.run("%accelerate start -n 2 --cpu", timeout=180)
        assert out.error is None, out.traceback
        yield k


def _ok(out) -> str:
    assert out.error is None, out.traceback + out.text
    assert not out.timed_out
    return out.stdout + out.stderr


def _session_ranks(k: KernelSession) -> tuple[str, dict[int, int]]:
    text = _ok(
        k.run(
            "from accel_nb.notebook.session_magics import active_session as _active\n"
            "print(_active().log_dir, *(f'{p.rank}:{p.pid}' for p in _active().procs))"
        )
    )
    log_dir, *pairs = text.split()
    return log_dir, {int(r): int(p) for r, p in (pair.split(":") for pair in pairs)}


def _status(k: KernelSession) -> str:
    return _ok(k.run("from accel_nb.notebook.session_view import status_text\nprint(status_text(_active()))"))


def _wait_until_stacks_show(
    log_dir: str, pids: dict[int, int], wanted: dict[int, str], within: float = 60
) -> None:
    """Ask each rank for its stacks until every one shows its ``wanted`` text (then it is in that call)."""
    deadline = time.monotonic() + within
    seen = {}
    while time.monotonic() < deadline:
        for rank, text in wanted.items():
            if seen.get(rank):
                continue
            path = stacks_path(log_dir, rank)
            size = os.path.getsize(path) if os.path.exists(path) else 0
            os.kill(pids[rank], STACKS_SIGNAL)
            new = ""
            for _ in range(100):  # faulthandler writes from the signal handler; read what it appended
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        f.seek(size)
                        new = f.read().decode("utf-8", "replace")
                if text in new:
                    break
                time.sleep(0.02)
            seen[rank] = text in new
        if all(seen.get(rank) for rank in wanted):
            return
        time.sleep(0.1)
    raise AssertionError(f"the ranks never reached {wanted} (seen {seen})")


def _interrupt_in(k: KernelSession, cell: str, wanted: dict[int, str]):
    log_dir, pids = _session_ranks(k)
    msg_id = k.kc.execute(cell)
    _wait_until_stacks_show(log_dir, pids, wanted)
    k.km.interrupt_kernel()
    return k.collect(msg_id, timeout=90)


def test_an_interrupted_sleep_says_where_without_accel_nb_frames_or_contradictions(kernel):
    out = _interrupt_in(
        kernel,
        "%%accelerate\nimport time\nx = 1\ntime.sleep(300)\n",
        {0: "line 4 in <module>", 1: "line 4 in <module>"},
    )
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out.text
    note = out.error["evalue"]
    assert "session is still usable" in note and "stacks above" not in note and "pane" not in note, note
    # the user's cell only, none of the launcher's frames
    assert "accel_nb" not in out.traceback, out.traceback
    assert re.search(r'\] stopped: KeyboardInterrupt at File "<accelerate-cell-\d+>", line 4', out.stderr), (
        out.stderr
    )
    status = _status(kernel)
    assert "failed in" not in status and len(re.findall(r"interrupted in cell \d+", status)) == 2, status


def test_an_interrupt_while_rank_0_waits_in_all_reduce_and_rank_1_sleeps_names_rank_0_only(kernel):
    cell = (
        "%%accelerate\n"
        "import time, torch\n"
        "if torch.distributed.get_rank() == 0:\n"
        "    torch.distributed.all_reduce(torch.ones(1))\n"
        "else:\n"
        "    time.sleep(300)\n"
    )
    out = _interrupt_in(kernel, cell, {0: "in all_reduce", 1: "line 6 in <module>"})
    assert not out.timed_out
    assert out.error is not None and out.error["ename"] == "KeyboardInterrupt", out.text
    note = out.error["evalue"]
    assert (
        "rank 0 (in all_reduce) did not stop at the interrupt and was freed by closing the process group"
        in note
    )
    assert "rank 1" not in note and "0, 1" not in note, note  # rank 1 stopped at its sleep: not stuck
    assert "a fresh one was formed on the same workers" in note and "accel_nb" not in out.traceback, (
        out.traceback
    )
    # each rank's stop line points at the cell's line (its body's, below the magic line), not at torch's frames
    assert re.search(r'\[rank 0\] stopped: \w+ at File "<accelerate-cell-\d+>", line 4', out.stderr), (
        out.stderr
    )
    assert re.search(
        r'\[rank 1\] stopped: KeyboardInterrupt at File "<accelerate-cell-\d+>", line 6', out.stderr
    )
    assert "c10d_logger" not in "".join(line for line in out.stderr.splitlines() if "stopped:" in line)
    status = _status(kernel)
    assert "failed in" not in status and len(re.findall(r"interrupted in cell \d+", status)) == 2, status


def test_stop_says_the_session_was_stopped(kernel):
    assert "the session was stopped: its 2 workers ended" in _ok(kernel.run("%accelerate stop"))
    assert "no session was running" in _ok(kernel.run("%accelerate stop"))
