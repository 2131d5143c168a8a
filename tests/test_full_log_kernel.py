"""After a failed launch, each rank's full log opens as text in the cell (issue 41, item 1): a button under
the rank's output pane, clicked the way the front-end clicks it (a comm message to the kernel)."""

from __future__ import annotations

import json
import time

import pytest

from tests.kernel_helpers import KernelSession

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc]

CELL = """
from accel_nb import notebook_launcher
from accel_nb.state import PartialState

def noisy():
    rank = PartialState().process_index
    for i in range(300):
        print(f"rank {rank} line {i}")
    if rank == 1:
        raise ValueError("rank 1 gives up")

notebook_launcher(noisy, num_processes=2)
"""


def _models(comms: list[dict]) -> dict[str, dict]:
    """comm id -> the widget model's state, updates folded in."""
    models: dict[str, dict] = {}
    for c in comms:
        data = c.get("data", {})
        if c["msg_type"] == "comm_open":
            models[c["comm_id"]] = dict(data.get("state", {}))
        elif c["msg_type"] == "comm_msg" and data.get("method") == "update" and c["comm_id"] in models:
            models[c["comm_id"]].update(data.get("state", {}))
    return models


def test_a_failed_launch_offers_each_ranks_full_log_as_text():
    with KernelSession(env={"ACCEL_NB_PROGRESS": "auto"}) as k:  # the live widget
        out = k.run(CELL, timeout=180)
        assert out.error is not None and out.error["ename"] == "LaunchError"
        models = _models(out.comms)
        buttons = {
            state["description"]: cid
            for cid, state in models.items()
            if state.get("_model_name") == "ButtonModel" and "full log" in state.get("description", "")
        }
        assert set(buttons) == {"Show rank 0's full log", "Show rank 1's full log"}, buttons
        # the front-end's click: a custom comm message to the button's model
        kc = k.kc
        msg = kc.session.msg(
            "comm_msg",
            {
                "comm_id": buttons["Show rank 1's full log"],
                "data": {"method": "custom", "content": {"event": "click"}},
            },
        )
        kc.shell_channel.send(msg)
        shown = ""
        deadline = time.monotonic() + 60  # a bound: the kernel answers at once when idle
        while "rank 1 line 299" not in shown and time.monotonic() < deadline:
            try:
                m = kc.get_iopub_msg(timeout=1)
            except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the bound
                continue
            if m["msg_type"] == "comm_msg":
                shown += json.dumps(m["content"].get("data", {}).get("state", {}))
        assert "rank 1 line 0" in shown and "rank 1 line 299" in shown, shown[-2000:]
        assert "rank1.log" in shown and "<pre" in shown  # as text, with the file it came from
