"""Acceptance: a REAL Jupyter kernel launches 2 ranks that iterate with accel_nb.progress.

Asserts on what the kernel sends: the widget's comm messages (models opened, bar values rising to
the total for each rank, final colours and status), the text fallback (ACCEL_NB_PROGRESS=text),
and the final state kept by a headless (nbclient) execution.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.kernel_helpers import ROOT, KernelSession

pytest.importorskip("ipywidgets")
if not os.path.exists(os.path.join(ROOT, "accel_nb", "notebook", "launcher.py")):
    pytest.skip("needs accel_nb.notebook.launcher", allow_module_level=True)

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(300)]

STEPS = 240

LOOP_CELL = f"""
import time
from accel_nb import notebook_launcher, progress

def train(fail_rank=None):
    import os
    bar = progress(range({STEPS}), desc="train")
    for i in bar:
        time.sleep(0.002)
        bar.set_postfix(loss=1.0 / (i + 1))
        if fail_rank is not None and int(os.environ["RANK"]) == fail_rank and i == 50:
            raise ValueError("boom at step 50")
    print("rank", os.environ["RANK"], "finished its loop")
    return int(os.environ["RANK"])
"""


def _models(out, name):
    """comm ids of the widget models named ``name`` (in creation order) and their opening state."""
    return [
        (c["comm_id"], c["data"]["state"])
        for c in out.comms
        if c["msg_type"] == "comm_open" and c.get("data", {}).get("state", {}).get("_model_name") == name
    ]


def _updates(out, comm_id):
    """The successive state updates the kernel sent for one widget model."""
    return [
        c["data"]["state"]
        for c in out.comms
        if c["msg_type"] == "comm_msg" and c["comm_id"] == comm_id and c["data"].get("method") == "update"
    ]


def _final(opening, updates):
    state = dict(opening)
    for u in updates:
        state.update(u)
    return state


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:
        assert k.run(LOOP_CELL, timeout=60).error is None
        yield k


def test_widget_bars_rise_to_the_total_and_turn_green(kernel):
    out = kernel.run(
        "results = notebook_launcher(train, num_processes=2, cpu=True)\nprint(results)", timeout=180
    )
    assert out.error is None, out.traceback
    assert "[0, 1]" in out.stdout
    bars = _models(out, "IntProgressModel")
    assert len(bars) == 2, "one progress bar per rank"
    assert {"VBoxModel", "HBoxModel", "HTMLModel", "AccordionModel"} <= {
        c["data"]["state"].get("_model_name") for c in out.comms if c["msg_type"] == "comm_open"
    }
    for comm_id, opening in bars:
        updates = _updates(out, comm_id)
        values = [u["value"] for u in updates if "value" in u]
        assert values, "the bar never moved"
        assert values == sorted(values), f"values must only rise: {values}"
        final = _final(opening, updates)
        assert final["value"] == STEPS and final["max"] == STEPS
        assert final["bar_style"] == "success"
    # throttled: far fewer bar updates than steps
    total_updates = sum(len(_updates(out, cid)) for cid, _ in bars)
    assert total_updates < STEPS
    htmls = [_final(s, _updates(out, cid)) for cid, s in _models(out, "HTMLModel")]
    texts = [h.get("value", "") for h in htmls]
    assert sum(">done<" in t for t in texts) == 2, "a green 'done' status per rank"
    assert any(f"{STEPS}/{STEPS}" in t and "loss=" in t for t in texts)
    assert any("rank 0 finished its loop" in t for t in texts), "rank 0's log pane"
    assert any("2 done" in t for t in texts), "aggregate line"
    # ranks' prints still reach the cell, whole and labelled
    assert (
        "[rank 0] rank 0 finished its loop\n" in out.stdout
        and "[rank 1] rank 1 finished its loop\n" in out.stdout
    )
    # the output's text form ends as the final summary (what saved/executed notebooks show)
    updates = [m["content"]["data"] for m in out.messages if m["msg_type"] == "update_display_data"]
    assert updates and updates[-1]["text/plain"].startswith("accel_nb launch finished: 2 processes")
    assert "rank 1 done" in updates[-1]["text/plain"] and f"{STEPS}/{STEPS}" in updates[-1]["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in updates[-1]


def test_failing_rank_turns_red_with_its_traceback(kernel):
    out = kernel.run("notebook_launcher(train, args=(1,), num_processes=2, cpu=True)", timeout=180)
    assert out.error is not None and out.error["ename"] == "LaunchError"
    (rank0_id, s0), (rank1_id, s1) = _models(out, "IntProgressModel")
    assert _final(s1, _updates(out, rank1_id))["bar_style"] == "danger"
    assert _final(s0, _updates(out, rank0_id))["bar_style"] != "danger"
    htmls = [_final(s, _updates(out, cid)).get("value", "") for cid, s in _models(out, "HTMLModel")]
    box = [t for t in htmls if "rank 1 failed: ValueError: boom at step 50" in t]
    assert box, "a failure box naming the rank and the exception"
    # live, the box showed the traceback; once the LaunchError (which carries it) is raised, only its line
    live = [u.get("value", "") for cid, _ in _models(out, "HTMLModel") for u in _updates(out, cid)]
    assert any("rank 1 failed: ValueError" in v and "raise ValueError" in v for v in live)
    assert "Traceback" not in box[0] and "its traceback is in the error below" in box[0]
    assert "raise ValueError" in out.traceback
    assert any("failed: ValueError" in t for t in htmls), "the rank's status"
    accordion = [_final(s, _updates(out, cid)) for cid, s in _models(out, "AccordionModel")]
    assert accordion[0]["selected_index"] is None, "rank 1 printed nothing: no pane opens to say 'no output'"
    updates = [m["content"]["data"] for m in out.messages if m["msg_type"] == "update_display_data"]
    assert "rank 1 failed" in updates[-1]["text/plain"]
    assert kernel.children() == []


def test_text_fallback_prints_whole_rank_prefixed_lines():
    cell = LOOP_CELL + (
        "\ndef chatty():\n"
        "    import os\n"
        "    r = os.environ['RANK']\n"
        "    for i in progress(range(50), desc='chat'):\n"
        "        print(f'rank {r} line {i} ' + 'x' * 200)\n"
        "    return train()\n"
        "results = notebook_launcher(chatty, num_processes=2, cpu=True)\nprint(results)"
    )
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run(cell, timeout=180)
    assert out.error is None, out.traceback
    assert not [c for c in out.comms if c["msg_type"] == "comm_open"], "no widget in text mode"
    text = out.stdout + out.stderr
    assert text.endswith("\n")
    lines = [line for line in text.splitlines() if line.strip()]
    rank_lines = [line for line in lines if "[rank" in line]
    assert all(re.match(r"^\[rank [01]\] ", line) for line in rank_lines), "prefix at the start of the line"
    assert all(line.count("[rank") <= 1 for line in lines), "no two ranks' text on one line"
    for rank in (0, 1):
        mine = [line for line in rank_lines if line.startswith(f"[rank {rank}] ")]
        assert sum(bool(re.search(r"line \d+ x{200}$", line)) for line in mine) == 50, (
            "every printed line whole"
        )
        assert any(f"{STEPS}/{STEPS}" in line for line in mine), "the final progress line"
    assert "[0, 1]" in out.stdout


@pytest.mark.notebooks
def test_executed_notebook_keeps_the_final_state(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(LOOP_CELL),
        nbformat.v4.new_code_cell("notebook_launcher(train, num_processes=2, cpu=True)"),
    ]
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpec

    km = KernelManager()
    km._kernel_spec = KernelSpec(  # this interpreter (the project's venv), like KernelSession
        argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], language="python"
    )
    client = nbclient.NotebookClient(
        nb,
        km=km,
        timeout=180,
        resources={"metadata": {"path": ROOT}},
        store_widget_state=True,
    )
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    outputs = nb.cells[1].outputs
    plain = "".join(
        o.get("data", {}).get("text/plain", "") for o in outputs if o.get("output_type") == "display_data"
    )
    assert plain.startswith("accel_nb launch finished: 2 processes"), plain
    assert "rank 0 done" in plain and "rank 1 done" in plain and f"{STEPS}/{STEPS}" in plain
    state = (
        nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    )
    bars = [m["state"] for m in state.values() if m.get("model_name") == "IntProgressModel"]
    assert len(bars) == 2 and all(b["value"] == STEPS and b["bar_style"] == "success" for b in bars)


TQDM_CELL = """
import logging, traitlets.log
# the kernel's own log (where jupyter_client warns when a forked process sends) into a file
traitlets.log.get_logger().addHandler(logging.FileHandler({log!r}))
import tqdm.auto  # in a kernel: the ipywidgets bar of tqdm.notebook
from accel_nb import notebook_launcher

def with_library_bars():
    import time
    for _ in tqdm.auto.tqdm(range(50), desc="tokenize"):
        time.sleep(0.002)
    return 0

notebook_launcher(with_library_bars, num_processes=2, cpu=True)
"""


def test_library_tqdm_bars_become_each_ranks_row_and_never_touch_the_kernel(kernel, tmp_path):
    """Issue 15.2: tqdm.auto in a forked rank reports 50/50 per rank; no widget or message from the fork."""
    log = str(tmp_path / "kernel.log")
    out = kernel.run(TQDM_CELL.format(log=log), timeout=180)
    assert out.error is None, out.traceback
    with open(log) as f:
        kernel_log = f.read()
    assert "from fork" not in kernel_log, "a rank tried to write to the kernel's sockets"
    assert "from fork" not in repr(out.messages)
    assert "tokenize" not in out.stderr, "no tqdm text bars printed by the ranks"
    bars = _models(out, "IntProgressModel")
    assert len(bars) == 2, "only accel_nb's bars: one per rank (tqdm made no widget of its own)"
    htmls = [_final(s, _updates(out, cid)).get("value", "") for cid, s in _models(out, "HTMLModel")]
    rows = [t for t in htmls if "tokenize" in t and "<b>" in t]
    assert len(rows) == 2 and all("50/50" in t for t in rows), rows
    for comm_id, opening in bars:
        final = _final(opening, _updates(out, comm_id))
        assert final["value"] == 50 and final["max"] == 50


def stuck_cell(sleep_s: float = 8, reporter: str | None = None, gate: str | None = None) -> str:
    """A cell whose 2 ranks finish a 50-step loop, then rank 1 sleeps while rank 0 waits in all_reduce.

    ``gate``: rank 1 sleeps until that file exists instead (the test opens it once it saw the stall).
    """
    extra = f", reporter={reporter}" if reporter else ""
    wait = (
        # bounded: a test that fails before opening the gate must not leave the launch waiting
        f"end = time.monotonic() + 180\n        while not os.path.exists({gate!r}) and time.monotonic() < end:"
        "\n            time.sleep(0.05)"
        if gate
        else f"time.sleep({sleep_s})"
    )
    return f"""
from accel_nb import notebook_launcher, progress
from accel_nb.launch.parent.reporting import TextReporter
from accel_nb.notebook.live.progress_widget import WidgetReporter

def one_rank_sleeps():
    import os, time
    import torch
    import torch.distributed as dist
    from accel_nb import PartialState
    PartialState()
    for _ in progress(range(50), desc="train"):
        time.sleep(0.02)
    if os.environ["RANK"] == "1":
        {wait}  # rank 0 waits in all_reduce meanwhile
    dist.all_reduce(torch.ones(1))
    return 0

notebook_launcher(one_rank_sleeps, num_processes=2, cpu=True{extra})
"""


def test_stuck_ranks_say_how_long_they_have_been_quiet_while_it_lasts(kernel):
    """Issue 15.3: rows of quiet ranks move on without events: 'no progress for N s', a rate that decays."""
    out = kernel.run(stuck_cell(), timeout=180)
    assert out.error is None, out.traceback
    infos = []  # every value the rank rows' detail cells showed, in order
    for comm_id, opening in _models(out, "HTMLModel"):
        values = [opening.get("value", "")] + [u["value"] for u in _updates(out, comm_id) if "value" in u]
        if any("train" in v and "<b>" in v for v in values):
            infos.append(values)
    assert len(infos) == 2
    for values in infos:
        quiet = [v for v in values if "no progress for" in v]
        assert quiet, "each rank's row said it was quiet while rank 1 slept"
        counts = [int(m) for v in quiet for m in re.findall(r"no progress for (\d+) s", v)]
        assert len(set(counts)) >= 2, f"the quiet time kept counting: {counts}"
        rates = [r for v in values for r in re.findall(r"([\d.]+) (?:it/s|s/it)", v)]
        assert len(set(rates)) >= 2, "the shown rate changed (decayed) while the rank was quiet"
        assert "no progress" not in values[-1], "finished: no quiet note left"


OUTPUT_CELL = """
from accel_nb import notebook_launcher
from accel_nb.launch.parent.reporting import TextReporter

def chatty_then_fails():
    import os
    rank = os.environ["RANK"]
    print("loading the same weights")  # every rank prints it
    for i in range(30000):  # a flood: far more than the cell can show
        print(f"rank {rank} flood {i}")
    if rank == "1":
        raise ValueError("bad value\\nsecond line of the message")
    import time
    time.sleep(30)

# a wide merge window: forked ranks on a loaded 2-core machine can start a second apart
notebook_launcher(chatty_then_fails, num_processes=2, cpu=True, reporter=TextReporter(merge_window=5))
"""


def test_text_output_merges_identical_lines_collapses_floods_and_says_a_failure_once():
    """Issue 15.6 in a real kernel, text mode: what the cell prints stays readable."""
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        out = k.run(OUTPUT_CELL, timeout=180)
    assert out.error is not None and out.error["ename"] == "LaunchError"
    text = out.stdout + out.stderr
    assert text.count("loading the same weights") == 1 and "[ranks 0,1] loading the same weights" in text
    notes = [line for line in text.splitlines() if "dropp" in line]
    for rank in (0, 1):
        mine = [line for line in notes if line.startswith(f"[rank {rank}]")]
        assert 1 <= len(mine) <= 2, f"one note when the flood starts, one total at the end: {mine}"
    failed = [line for line in text.splitlines() if "failed" in line]
    assert failed == ["[rank 1] failed: ValueError: bad value ..., stopping the other ranks"], failed
    assert "second line of the message" not in text  # the full message is in the LaunchError


def test_text_mode_names_the_quiet_ranks_while_they_are_stuck(kernel):
    """Issue 15.3, text fallback: a line per quiet rank, repeated only as the silence doubles."""
    cell = stuck_cell(reporter="TextReporter(stall_after=3)")
    out = kernel.run(cell, timeout=180)
    assert out.error is None, out.traceback
    quiet = [line for line in out.stderr.splitlines() if "no progress for" in line]
    for rank in (0, 1):
        mine = [line for line in quiet if line.startswith(f"[rank {rank}] stalled")]
        assert 1 <= len(mine) <= 3, quiet  # at 3 s, then about 6 s (rank 1 sleeps 8 s)
        assert "50/50" in mine[0]


WIDGET_CELL = """
import logging, traitlets.log
traitlets.log.get_logger().addHandler(logging.FileHandler({log!r}))
import ipywidgets
from IPython.display import display
from accel_nb import notebook_launcher

def with_a_widget():
    slider = ipywidgets.IntSlider(value=3)   # a comm: would send comm_open on the kernel's session
    display(slider)
    slider.value = 7
    return slider.value

values = notebook_launcher(with_a_widget, num_processes=2, cpu=True, progress="text")
print("values", values)
"""


def test_widgets_made_in_a_rank_never_send_on_the_kernels_session(kernel, tmp_path):
    """A widget created inside a forked rank sends nothing through the kernel (no 'from fork' warning)."""
    log = str(tmp_path / "kernel.log")
    out = kernel.run(WIDGET_CELL.format(log=log), timeout=180)
    assert out.error is None, out.traceback
    with open(log) as f:
        kernel_log = f.read()
    assert "from fork" not in kernel_log, kernel_log
    assert "values [7, 7]" in out.stdout, out.stdout
