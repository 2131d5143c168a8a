"""The notebook face in a real kernel of the stack (Colab's IPython 7.34 / ipykernel 6.17 / ipywidgets 7.7.1,
or Kaggle's ipywidgets 8.1.5 / ipykernel 6.29): live widget progress, the wizard, the device map,
a session, and a failing cell whose traceback is the user's.

Asserts on what the kernel sends (comm messages of the widget models, display bundles, errors):
the front-end side is tests/stacks/test_stack_browser.py.
"""

from __future__ import annotations

import os
import queue
import re
import time

import pytest

from tests.kernel_helpers import KernelSession

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(300)]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# the loop stops at these steps until the test creates the gate file: the widget is read mid-launch
GATES = (30, 60)
SETUP = f"""
%load_ext accel_nb
import os, time
from accel_nb import notebook_launcher, progress

def train(gates_dir):
    bar = progress(range(100), desc="train")
    for i in bar:
        if i in {GATES!r}:
            bar.refresh()  # send n = i now: the loop is about to wait
            while not os.path.exists(os.path.join(gates_dir, f"gate{{i}}")):
                time.sleep(0.02)
    print("rank", os.environ["RANK"], "finished its loop")
    return int(os.environ["RANK"])
"""
PROBLEMS = ("reporter failed", "the progress widget could not", "display failed to start")


@pytest.fixture(scope="module")
def kernel():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:
        out = k.run(SETUP, timeout=120)
        assert out.error is None, out.traceback
        yield k


def _prompt(out) -> int:
    """The In [N] number the front-end shows for the cell of ``out``."""
    return [m["content"]["execution_count"] for m in out.messages if m["msg_type"] == "execute_input"][0]


def _bars(comms):
    """comm id -> state of every IntProgress model opened so far (updates folded in)."""
    bars = {}
    for c in comms:
        data = c.get("data", {})
        if c["msg_type"] == "comm_open" and data.get("state", {}).get("_model_name") == "IntProgressModel":
            bars[c["comm_id"]] = dict(data["state"])
        elif c["msg_type"] == "comm_msg" and c["comm_id"] in bars and data.get("method") == "update":
            bars[c["comm_id"]].update(data["state"])
    return bars


def test_live_progress_changes_while_the_launch_runs_and_ends_right(kernel, tmp_path):
    msg_id = kernel.kc.execute(
        f"results = notebook_launcher(train, args=({str(tmp_path)!r},), num_processes=2, cpu=True)"
    )
    comms, stdout, stderr, bundles, error = [], "", "", [], None
    seen_running = []  # the bars' values each time both ranks waited at a gate (the launch still running)
    gates = list(GATES)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1.0)
        except queue.Empty:
            continue
        mtype, content = msg["msg_type"], msg["content"]
        if mtype.startswith("comm_"):
            comms.append({"msg_type": mtype, **content})
            values = sorted(s.get("value") for s in _bars(comms).values())
            if gates and values == [gates[0], gates[0]]:
                seen_running.append(values)
                open(tmp_path / f"gate{gates.pop(0)}", "w").close()
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if mtype == "stream":
            stdout, stderr = (
                (stdout + content["text"], stderr)
                if content["name"] == "stdout"
                else (stdout, stderr + content["text"])
            )
        elif mtype in ("display_data", "update_display_data"):
            bundles.append((mtype, content["data"]))
        elif mtype == "error":
            error = content
        elif mtype == "status" and content.get("execution_state") == "idle":
            break
    assert error is None, "\n".join(error["traceback"])
    assert seen_running == [[30, 30], [60, 60]], (seen_running, _bars(comms))
    final = _bars(comms)
    assert len(final) == 2 and all(
        (s["value"], s["max"], s["bar_style"]) == (100, 100, "success") for s in final.values()
    ), final
    # shown once as a widget view (IPython's display API), updated at the end to the final text summary
    shown = [b for kind, b in bundles if kind == "display_data" and WIDGET_VIEW in b]
    assert len(shown) == 1 and "live progress widget" in shown[0]["text/plain"], bundles
    updates = [b for kind, b in bundles if kind == "update_display_data"]
    assert updates and updates[-1][WIDGET_VIEW] == shown[0][WIDGET_VIEW], updates
    assert updates[-1]["text/plain"].startswith("accel_nb launch finished: 2 processes"), updates[-1]
    assert "rank 0 finished its loop" in stdout and "rank 1 finished its loop" in stdout
    assert not any(p in stderr + stdout for p in PROBLEMS), stderr
    assert kernel.run("print(results)").stdout.strip() == "[0, 1]"


def test_a_failing_accelerate_cell_shows_the_users_traceback_only(kernel):
    out = kernel.run("%%accelerate -n 2\nvalue = 1\nraise ValueError(f'bad value {value}')\n", timeout=180)
    assert out.error is not None and out.error["ename"] == "LaunchError", out.stderr
    tb = out.traceback
    assert (
        "rank 0 (first to fail) failed: ValueError: bad value 1" in tb
        or "failed: ValueError: bad value 1" in tb
    )
    assert "raise ValueError(f'bad value {value}')" in tb
    # named after its In [N] prompt (IPython 7 and 8 count the running cell up after it, 9 before)
    assert f'File "<accelerate-cell-{_prompt(out)}>"' in tb, (_prompt(out), tb)
    for internal in (
        "interactiveshell",
        "decorator",
        "magic.py",
        "accel_nb/",
        "IPython/core",
        "run_cell_magic",
    ):
        assert internal not in tb, (internal, tb)
    assert not any(p in out.stderr + out.stdout for p in PROBLEMS), out.stderr
    # a one-shot cell keeps its final summary in the output (the widget view's text)
    assert any(
        r.get("text/plain", "").startswith("accel_nb launch failed: 2 processes") for r in out.results
    ), out.results


def test_a_session_is_started_used_and_stopped(kernel):
    out = kernel.run("%accelerate start -n 2", timeout=180)
    assert out.error is None, out.traceback
    try:
        out = kernel.run(
            "%%accelerate\nfrom accel_nb import PartialState\nscaled = PartialState().process_index * 10\n",
            timeout=120,
        )
        assert out.error is None, out.traceback
        out = kernel.run("%%accelerate\nraise KeyError('in the session')\n", timeout=120)
        assert out.error is not None and f'File "<accelerate-cell-{_prompt(out)}>"' in out.traceback, (
            out.traceback
        )
        out = kernel.run("%accelerate pull scaled --rank 1\nprint('scaled', scaled)", timeout=60)
        assert out.error is None, out.traceback
        assert "scaled 10" in out.stdout
        assert not any(p in out.stderr + out.stdout for p in PROBLEMS), out.stderr
    finally:
        out = kernel.run("%accelerate stop", timeout=120)
    assert out.error is None, out.traceback


def test_the_wizard_and_the_device_map_show_as_widgets_and_act(kernel, tmp_path):
    path = tmp_path / "config.yaml"
    out = kernel.run(
        f"from accel_nb import config_wizard\nwizard = config_wizard({str(path)!r})\nwizard", timeout=60
    )
    assert out.error is None, out.traceback
    assert any(WIDGET_VIEW in r for r in out.results), out.results
    out = kernel.run(
        "wizard.set_values(num_processes=2, mixed_precision='no')\nprint(wizard.save())", timeout=60
    )
    assert out.error is None, out.traceback
    assert os.path.exists(path) and "num_processes: 2" in path.read_text()
    out = kernel.run(
        "import torch\nfrom accel_nb import init_empty_weights, show_device_map\n"
        "with init_empty_weights():\n    net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])\n"
        "view = show_device_map(net, max_memory={'cpu': '20KiB', 'disk': '1GB'})\n"
        "view.set_budget('cpu', '1MiB')\nprint(sorted(set(view.device_map.values())))",
        timeout=60,
    )
    assert out.error is None, out.traceback
    shown = [r for r in out.results if WIDGET_VIEW in r]
    assert len(shown) == 1 and "accel-nb-device-map" in shown[0].get("text/html", ""), out.results
    assert out.stdout.strip() == "['cpu']", out.stdout  # the budget moved: everything fits the CPU now
    assert not any(p in out.stderr for p in PROBLEMS), out.stderr


def test_a_widget_that_cannot_render_hands_over_to_the_text_view_in_the_kernel(kernel, tmp_path):
    """The widget's display is made to fail on purpose: one line says why, text progress and the summary follow."""
    for gate in GATES:
        open(tmp_path / f"gate{gate}", "w").close()  # no waiting in this launch
    out = kernel.run(
        "import accel_nb.notebook.live.progress_widget as pw\n"
        "_kept = pw.view_bundle\n"
        "def _refuse(widget, text=None):\n"
        "    raise RuntimeError('this front-end shows no widgets')\n"
        "pw.view_bundle = _refuse\n"
        "try:\n"
        f"    again = notebook_launcher(train, args=({str(tmp_path)!r},), num_processes=2, cpu=True)\n"
        "finally:\n"
        "    pw.view_bundle = _kept\n"
        "print('again', again)",
        timeout=180,
    )
    assert out.error is None, out.traceback
    lines = [line for line in out.stderr.splitlines() if "the progress widget could not" in line]
    assert lines == [
        "[accel_nb] the progress widget could not render (RuntimeError: this front-end shows no widgets); "
        "showing text progress for the rest of this launch"
    ], out.stderr
    assert not any(WIDGET_VIEW in r for r in out.results), out.results  # no widget view was left behind
    for rank in (0, 1):  # the text view's progress line of each rank's finished loop
        assert re.search(rf"^\[rank {rank}\] train: .*100/100", out.stdout, re.M), out.stdout
    summary = out.stdout[out.stdout.index("accel_nb launch finished: 2 processes") :]
    assert "rank 0 done" in summary and "rank 1 done" in summary
    assert "again [0, 1]" in out.stdout
