"""pdb in a rank, typed into JupyterLab's input box in a real browser (issue 42).

A cell launches two ranks; rank 1 stops at ``breakpoint()`` while rank 0 waits for it in ``all_reduce``.
The test types pdb commands into the page's stdin box as a person would and reads the answers, and
the progress widget's rows while the prompt is open. Screenshots: artifacts/screenshots/rank_pdb_*.png.
"""

from __future__ import annotations

import pytest

from tests.browser_helpers import (
    SHOTS,
    LabServer,
    cell_done,
    cell_outputs,
    chromium,
    new_page,
    open_notebook,
    outputs_text,
    run_cell,
    screenshot,
    wait_until,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

LAUNCH = """
from accel_nb import notebook_launcher

def train():
    import torch, torch.distributed as dist
    from accel_nb import PartialState
    rank = PartialState().process_index
    t = torch.tensor([1.0 + rank])
    if rank == 1:
        breakpoint()
        t = t * 10
    dist.all_reduce(t)   # rank 0 waits here for rank 1
    return t.item()

notebook_launcher(train, num_processes=2, cpu=True)
"""


def _cell_text(page, index: int) -> str:
    """What cell ``index`` shows: its outputs (streams, widgets' text) as the page renders them."""
    return page.evaluate(
        "i => window.jupyterapp.shell.currentWidget.content.widgets[i].node.querySelector('.jp-OutputArea').innerText",
        index,
    )


def _type(page, line: str) -> None:
    box = page.locator(".jp-Stdin-input").last
    box.fill(line)
    box.press("Enter")


def _prompts(page) -> int:
    return page.locator(".jp-Stdin-input").count()


def test_pdb_commands_typed_into_jupyterlabs_input_box(tmp_path):
    write_notebook(str(tmp_path / "pdb.ipynb"), ["%load_ext accel_nb", LAUNCH])
    with LabServer(str(tmp_path)) as lab, chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "pdb.ipynb")
        run_cell(page, 0)
        wait_until(lambda: cell_done(page, 0), 120, "%load_ext")
        run_cell(page, 1)
        wait_until(lambda: _prompts(page) == 1, 120, "rank 1's pdb prompt in the page")
        prompt = page.locator(".jp-Stdin-prompt").last.inner_text()
        assert "(rank 1 Pdb)" in prompt, prompt
        # pdb's lines (iopub) and the prompt (stdin) come on two channels: either may show first
        shown = (
            "rank 1 stopped in pdb",
            "breakpoint()",
            "waiting for rank 1 (in the debugger)",
        )  # the last: rank 0's row
        try:
            wait_until(
                lambda: all(s in _cell_text(page, 1) for s in shown), 30, "pdb's lines and rank 0's row"
            )
        finally:
            screenshot(page, "rank_pdb_prompt", SHOTS)

        _type(page, "p t")
        wait_until(lambda: "tensor([2.])" in _cell_text(page, 1) and _prompts(page) == 1, 60, "p t's answer")
        _type(page, "n")
        wait_until(lambda: "all_reduce(t)" in _cell_text(page, 1).split("p t")[-1], 60, "the step")
        wait_until(lambda: _prompts(page) == 1, 60, "the prompt after the step")
        _type(page, "p t")
        wait_until(lambda: "tensor([20.])" in _cell_text(page, 1), 60, "the stepped value")
        screenshot(page, "rank_pdb_after_step", SHOTS)
        wait_until(lambda: _prompts(page) == 1, 60, "the prompt")
        _type(page, "c")
        wait_until(lambda: cell_done(page, 1), 120, "the launch to end")
        screenshot(page, "rank_pdb_done", SHOTS)
        out = outputs_text(cell_outputs(page, 1))
        assert "[21.0, 21.0]" in out, out
