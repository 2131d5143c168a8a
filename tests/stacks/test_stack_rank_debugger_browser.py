"""pdb in a rank typed into classic Notebook 6's input box (Colab's stack: notebook 6.5.7, ipykernel 6.17, issue 42).

The JupyterLab 4 test (tests/test_rank_debugger_browser.py) on the classic front-end: rank 1 stops at
``breakpoint()`` while rank 0 waits in ``all_reduce``; pdb commands are typed into the page's stdin box.
Screenshots: artifacts/screenshots/stack_colab_rank_pdb_*.png.
"""

from __future__ import annotations

import pytest

from tests.browser_helpers import SHOTS, chromium, new_page, screenshot, wait_until, write_notebook
from tests.stacks.classic_helpers import ClassicServer, cell_done, cell_node, open_classic, run_cell
from tests.test_rank_debugger_browser import LAUNCH

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def _text(page, index: int) -> str:
    return cell_node(page, index).locator(".output_wrapper").inner_text()


def _prompts(page) -> int:
    return page.locator("input.raw_input").count()


def _type(page, line: str) -> None:
    box = page.locator("input.raw_input").last
    box.fill(line)
    box.press("Enter")


def test_pdb_commands_typed_into_notebook_6s_input_box(tmp_path, stack):
    if stack != "colab":
        pytest.skip("classic Notebook 6 is the colab stack's front-end")
    write_notebook(str(tmp_path / "pdb.ipynb"), ["%load_ext accel_nb", LAUNCH])
    with ClassicServer(str(tmp_path)) as server, chromium() as browser:
        page = new_page(browser)
        open_classic(page, server, "pdb.ipynb")
        run_cell(page, 0)
        wait_until(lambda: cell_done(page, 0), 120, "%load_ext")
        run_cell(page, 1)
        wait_until(lambda: _prompts(page) == 1, 120, "rank 1's pdb prompt in the page")
        assert "(rank 1 Pdb)" in page.locator(".raw_input_prompt").last.inner_text()
        shown = ("rank 1 stopped in pdb", "breakpoint()", "waiting for rank 1 (in the debugger)")
        try:
            wait_until(lambda: all(s in _text(page, 1) for s in shown), 30, "pdb's lines and rank 0's row")
        finally:
            screenshot(page, "stack_colab_rank_pdb_prompt", SHOTS)
        _type(page, "p t")
        wait_until(lambda: "tensor([2.])" in _text(page, 1) and _prompts(page) == 1, 60, "p t's answer")
        _type(page, "c")
        wait_until(lambda: cell_done(page, 1), 120, "the launch to end")
        screenshot(page, "stack_colab_rank_pdb_done", SHOTS)
        assert "[21.0, 21.0]" in _text(page, 1)
