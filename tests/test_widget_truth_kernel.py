"""The session widgets tell the truth, in a REAL Jupyter kernel (issue 27's widget points).

One kernel, in order as a user's notebook: start a session (its widget says ready/idle, not
done), a quiet cell (its clock runs from the cell's start), a failing cell (the traceback once,
no pane opened to say "no output"), stop (the start widget then says stopped).
"""

from __future__ import annotations

import os
import queue
import re
import tempfile
import time

import pytest

from tests.kernel_helpers import KernelSession
from tests.test_progress_kernel import _final, _models, _updates

pytest.importorskip("ipywidgets")
pytestmark = [pytest.mark.kernel, pytest.mark.multiproc, pytest.mark.slow]


def _ok(out):
    assert out.error is None, out.traceback + out.text
    assert not out.timed_out
    return out


def _html_values(out, updates_from=None):
    """The final value of every HTML model opened in ``out`` (updates read from ``updates_from`` too)."""
    values = []
    for cid, opening in _models(out, "HTMLModel"):
        ups = _updates(out, cid) + (_updates(updates_from, cid) if updates_from is not None else [])
        values.append((cid, _final(opening, ups).get("value", "")))
    return values


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:
        _ok(k.run("%load_ext accel_nb", timeout=120))
        yield k


@pytest.fixture(scope="module")
def started(kernel):
    out = _ok(kernel.run("%accelerate start -n 2 --cpu", timeout=180))
    return out


def test_session_start_widget_says_ready_idle_not_done(started):
    bars = [_final(s, _updates(started, cid)) for cid, s in _models(started, "IntProgressModel")]
    assert len(bars) == 2 and all(b["bar_style"] == "info" for b in bars), bars
    values = [v for _, v in _html_values(started)]
    assert sum("ready (idle)" in v for v in values) == 2, values
    assert not any(re.search(r">done<", v) for v in values), values
    aggregate = [v for v in values if "2 ranks:" in v]
    assert aggregate and "ready (idle" in aggregate[0] and "done" not in aggregate[0], aggregate
    finals = [r["text/plain"] for r in started.results if "text/plain" in r]
    assert "accel_nb session ready: workers alive and idle" in finals[-1], finals


def test_a_quiet_cell_clock_runs_from_the_cells_start(kernel, started):
    """The ranks wait (silent) for a file the test writes once the widget's clock moved on (1 to 4 s)."""
    flag = os.path.join(tempfile.mkdtemp(prefix="accel_nb-clock-"), "go")
    code = (
        "%%accelerate\nimport os, time\n"
        f"deadline = time.monotonic() + 90\nwhile not os.path.exists({flag!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    msg_id = kernel.kc.execute(code)
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(flag):
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1.0)
        except queue.Empty:
            continue
        value = msg["content"].get("data", {}).get("state", {}).get("value", "")
        if msg["msg_type"] == "comm_msg" and "2 ranks:" in str(value):
            seen.append(value)
            if re.search(r"elapsed 0:0[1-4]\b", value):  # before the "no output for 5 s" note redraws it
                open(flag, "w").close()
    out = _ok(kernel.collect(msg_id, timeout=120))
    assert os.path.exists(flag), f"the clock stood still while the cell was quiet: {seen}"
    assert "elapsed" in out.text or out.results is not None


def test_a_failing_rank_shows_its_traceback_once_and_opens_no_empty_pane(kernel, started):
    out = kernel.run(
        "%%accelerate\nimport torch.distributed as dist\nif dist.get_rank() == 1:\n    raise ValueError('boom on rank 1')\n"
    )
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert out.traceback.count('"<accelerate-cell-') == 1, out.traceback  # the rank's traceback, once
    values = [v for _, v in _html_values(out)]
    box = [v for v in values if "rank 1 failed: ValueError: boom on rank 1" in v]
    assert box and "its traceback is in the error below" in box[0], values
    assert not any("raise ValueError" in v for v in values), "the traceback is not repeated in the widget"
    accordion = [_final(s, _updates(out, cid)) for cid, s in _models(out, "AccordionModel")]
    assert accordion[0]["selected_index"] is None, "no pane opens by itself to show 'no output'"


def test_stop_turns_the_start_widget_to_stopped(kernel, started):
    out = _ok(kernel.run("%accelerate stop", timeout=60))
    assert "the session was stopped" in out.stdout
    bars = [
        _final(s, _updates(started, cid) + _updates(out, cid))
        for cid, s in _models(started, "IntProgressModel")
    ]
    assert all(b["bar_style"] == "warning" for b in bars), bars
    values = [v for _, v in _html_values(started, out)]
    assert sum(">stopped<" in v for v in values) == 2, values
    assert not any("ready (idle)" in v for v in values), values
    plain = [r["text/plain"] for r in out.results if "text/plain" in r]
    assert plain and "accel_nb session stopped (its workers ended)" in plain[-1], plain


def test_restarting_the_kernel_during_a_launch_leaves_the_widget_saying_so():
    """The old kernel pushes the widget's last state (kernel restarting, launch stopped) before it goes."""
    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:
        setup = (
            "from accel_nb import notebook_launcher, progress\n"
            "def slow():\n"
            "    import time\n"
            "    for _ in progress(range(1000), desc='train'):\n"
            "        time.sleep(0.5)\n"
        )
        _ok(k.run(setup, timeout=120))
        k.kc.execute("notebook_launcher(slow, num_processes=2, cpu=True)")
        running = False
        deadline = time.monotonic() + 180
        while not running and time.monotonic() < deadline:  # the bars moved: the launch is under way
            try:
                msg = k.kc.get_iopub_msg(timeout=1.0)
            except queue.Empty:
                continue
            state = msg["content"].get("data", {}).get("state", {})
            running = msg["msg_type"] == "comm_msg" and "running" in str(state.get("value", ""))
        assert running, "the launch never showed a running rank"
        k.km.restart_kernel(now=False)
        values = []
        while True:  # everything the old kernel sent before it went
            try:
                msg = k.kc.get_iopub_msg(timeout=5.0)
            except queue.Empty:
                break
            if msg["msg_type"] == "comm_msg":
                values.append(str(msg["content"].get("data", {}).get("state", {}).get("value", "")))
            elif msg["msg_type"] == "update_display_data":
                values.append(msg["content"]["data"].get("text/plain", ""))
        said = [v for v in values if "the kernel is restarting" in v]
        assert said, values[-10:]
        assert any(">stopped<" in v for v in values), values[-10:]
        assert any(v.startswith("accel_nb launch failed") and "kernel is restarting" in v for v in values), (
            values[-10:]
        )
