"""Issue 41 as a user sees it in JupyterLab 4 (Chromium): one notebook, run cell by cell.

- item 1: after the interrupted launch below, "Show rank 1's full log" shows the log as text in the
  cell; then the kernel's debugger is switched on with the notebook toolbar's bug button (debugpy in
  the kernel, as a user does it) and a plain ``%%accelerate -n 2`` runs and prints from both ranks;
- item 2: the cell's launch is titled after its ``In [N]`` prompt;
- items 3 and 4: a one-shot ``%%accelerate`` trains three epochs (a new bar per epoch, ``set_postfix``
  losses) and waits; once the live chart's line reaches step 24, the test interrupts the kernel (the toolbar's stop button's command) once the
  page shows both ranks waiting. The cell ends in a short KeyboardInterrupt with each rank's line and
  no accel_nb internals; the chart's line says each rank's last point is at step 24 (3 x 8: the
  steps kept counting across the bars).

Items 9 (the session start view) and 10 (the hang's culprit row) are asserted in the browser tests
that already run a session and a hang (test_widget_truth_browser, test_blame_flood_browser).
Screenshots: artifacts/screenshots/issue41-*.png.
"""

from __future__ import annotations

import os
import re

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
    wait_until,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

ANSI = re.compile(r"\x1b\[[0-9;]*m")

CELLS = [
    "%load_ext accel_nb",
    """%%accelerate -n 2
import time
from accel_nb import progress
for epoch in range(3):
    bar = progress(range(8), desc="train")
    for step in bar:
        time.sleep(0.12)  # a step (a bar sends every 0.1 s at most)
        bar.set_postfix(loss=1.0 / (8 * epoch + step + 1))
print("waiting for the interrupt", flush=True)
while True:
    time.sleep(0.05)
""",
    "%%accelerate -n 2\nimport os\nprint('hello from rank', os.environ['RANK'])",
]
LOAD, INTERRUPTED, DEBUGGED = range(3)
INTERNALS = ("supervisor.py", "_read_and_reap", "selectors.py", "interactiveshell.py", "accel_nb/")


def _text(page, i: int) -> str:
    return ANSI.sub("", outputs_text(cell_outputs(page, i)))


def _shot(page, node, name: str) -> None:
    node.scroll_into_view_if_needed()
    node.screenshot(path=os.path.join(SHOTS, f"issue41-{name}.png"))


def _prompt(node) -> int:
    return int(re.search(r"\[(\d+)\]", node.locator(".jp-InputPrompt").inner_text()).group(1))


def test_debugger_full_log_interrupt_and_chart_in_jupyterlab(tmp_path):
    root = str(tmp_path)
    os.makedirs(SHOTS, exist_ok=True)
    write_notebook(os.path.join(root, "issue41.ipynb"), CELLS)
    with LabServer(root) as lab, chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "issue41.ipynb")
        cells = page.locator(".jp-Notebook .jp-Cell")

        def run(i: int, timeout: float = 180) -> None:
            run_cell(page, i)
            wait_until(lambda: cell_done(page, i), timeout, f"cell {i} to finish")

        run(LOAD)
        # items 3 and 4: three epochs' bars, then both ranks wait; interrupted as the stop button does
        run_cell(page, INTERRUPTED)
        node = cells.nth(INTERRUPTED)
        wait_until(
            lambda: (
                re.search(r"\[ranks? 0,1\] waiting for the interrupt", node.inner_text())
                or node.inner_text().count("waiting for the interrupt") >= 2
            ),
            180,
            "both ranks waiting",
        )
        # item 4, live: before the launch ends the chart has drawn all three epochs (it did lag, showing
        # epoch 0 while epoch 2 ran), its line at step 24 for both ranks
        wait_until(
            lambda: (
                node.locator(".jupyter-widgets img").first.is_visible()
                and len(re.findall(r"rank \d: \d+ pts, last 0\.04\d* at step 24", node.inner_text())) == 2
            ),
            60,
            "the live chart to reach step 24",
        )
        assert not cell_done(page, INTERRUPTED)  # still running
        _shot(page, node, "4-live-chart")
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
        wait_until(lambda: cell_done(page, INTERRUPTED), 120, "the interrupted cell to end")
        errors = [o for o in cell_outputs(page, INTERRUPTED) if o["output_type"] == "error"]
        assert len(errors) == 1, errors
        shown = ANSI.sub("", "\n".join(errors[0]["traceback"]))
        assert "KeyboardInterrupt" in shown or "LaunchInterrupted" in shown, shown
        assert "the launch was interrupted: every rank was stopped" in shown, shown
        prompt = _prompt(node)
        for rank in (0, 1):  # each rank's line, in the cell named after its prompt (item 2)
            assert re.search(rf"rank {rank}: at .*line \d+ of <accelerate-cell-{prompt}>", shown), shown
        for internal in INTERNALS:
            assert internal not in shown, (internal, shown)
        assert len(shown.splitlines()) < 25, shown  # a short summary, not a traceback through the launcher
        # the chart: each rank's last loss is drawn at step 24 (epochs 2 and 3 went on after epoch 1)
        wait_until(lambda: node.locator(".jupyter-widgets img").first.is_visible(), 60, "the chart")
        line = node.inner_text()
        _shot(page, node, "3-4-interrupt-and-chart")
        for rank in (0, 1):
            assert re.search(rf"rank {rank}: \d+ pts, last 0\.04\d* at step 24", line), (
                line,
                cell_outputs(page, INTERRUPTED),
            )
        assert f"accelerate-cell-{prompt}" in line  # the launch's title names its In [N] (item 2)
        # item 1: the kept log opens as text in the cell (the button is in the rank's output pane)
        node.get_by_text("rank 1 output").first.click()
        node.locator("button", has_text="Show rank 1's full log").click()
        shown_log = node.locator(".accel-nb-full-log", has=page.locator("pre"))
        wait_until(
            lambda: shown_log.count() == 1 and "waiting for the interrupt" in shown_log.inner_text(),
            60,
            "the log",
        )
        assert "rank1.log" in shown_log.inner_text()  # the file it came from
        _shot(page, node, "1-full-log")  # the whole cell, its rank 1 pane open
        # item 1: the debugger on (the toolbar's bug button, enabled once the kernel says it can debug),
        # last: debugpy's tracing slows the kernel's own threads (the launch's chart drawing by seconds)
        bug = page.locator(".jp-DebuggerBugButton").first
        wait_until(lambda: bug.is_enabled(), 60, "the debugger button to be enabled")
        bug.click()
        wait_until(lambda: bug.get_attribute("aria-pressed") == "true", 60, "the debugger to be on")
        run(DEBUGGED)
        text = _text(page, DEBUGGED)
        assert "hello from rank 0" in text and "hello from rank 1" in text, text
        node = cells.nth(DEBUGGED)
        wait_until(lambda: node.inner_text().count("done") >= 2, 60, "both rows done")
        assert bug.get_attribute("aria-pressed") == "true"  # it ran with the debugger still on
        node.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(SHOTS, "issue41-1-debugger-on-launch.png"))  # the bug button too
        page.context.close()
