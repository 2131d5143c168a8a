"""Acceptance: from a REAL Jupyter kernel, 2 ranks log through the Accelerator; TensorBoard gets each
step once, and the launch's widget draws every rank's points (comm messages read back)."""

from __future__ import annotations

import pytest

from tests.kernel_helpers import KernelSession

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")
pytest.importorskip("tensorboard")
pytestmark = [pytest.mark.kernel, pytest.mark.multiproc, pytest.mark.timeout(300)]

STEPS = 30
PNG = b"\x89PNG\r\n\x1a\n"

TRAIN_CELL = f"""
import time
from accel_nb import Accelerator, notebook_launcher, progress

def train(project_dir):
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=project_dir)
    accelerator.init_trackers("kernel_run", config={{"lr": 0.1, "ranks": accelerator.num_processes}})
    rank = accelerator.process_index
    bar = progress(range({STEPS}), desc="train")
    for step in bar:
        time.sleep(0.01)
        accelerator.log({{"loss": 1.0 / (step + 1) + rank}}, step=step)
        bar.set_postfix(grad_norm=0.5 + step / 100)
    accelerator.end_training()
    return rank
"""


def _opened(out, model):
    return [
        c
        for c in out.comms
        if c["msg_type"] == "comm_open" and c["data"]["state"].get("_model_name") == model
    ]


def test_a_notebook_launch_logs_once_and_its_widget_draws_every_rank(tmp_path):
    from tests.test_tracking import tensorboard_hparams, tensorboard_scalars

    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as kernel:
        assert kernel.run(TRAIN_CELL, timeout=60).error is None
        out = kernel.run(
            f"print(notebook_launcher(train, args=({str(tmp_path)!r},), num_processes=2, cpu=True))",
            timeout=240,
        )
    assert out.error is None, out.traceback
    assert "[0, 1]" in out.stdout

    # the tracker: one run, each step once, written by process 0 only
    scalars = tensorboard_scalars(str(tmp_path / "kernel_run"))
    assert [s for s, _ in scalars["loss"]] == list(range(STEPS))
    assert scalars["loss"][-1][1] == pytest.approx(1.0 / STEPS)  # rank 0's values (rank 1's are + 1)
    assert tensorboard_hparams(str(tmp_path / "kernel_run"))["ranks"] == 2

    # the chart: an Image model that received PNGs, and its text line counts every rank's points
    (image,) = _opened(out, "ImageModel")
    pngs = [
        bytes(m["buffers"][0])
        for m in out.messages
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == image["comm_id"] and m.get("buffers")
    ]
    assert pngs and all(p.startswith(PNG) for p in pngs)
    texts = []
    for opened in _opened(out, "HTMLModel"):
        value = opened["data"]["state"].get("value", "")
        for c in out.comms:
            if c["msg_type"] == "comm_msg" and c["comm_id"] == opened["comm_id"]:
                value = c["data"].get("state", {}).get("value", value)
        texts.append(value)
    (chart_text,) = [t for t in texts if "<b>loss</b>" in t]
    for rank in (0, 1):
        assert f"rank {rank}: {STEPS} pts" in chart_text, chart_text
    assert "<b>grad_norm</b>" in chart_text
    # the finished output keeps the final picture next to the widget and the text summary
    final = [m["content"]["data"] for m in out.messages if m["msg_type"] == "update_display_data"][-1]
    assert "image/png" in final and final["text/plain"].startswith("accel_nb launch finished")
