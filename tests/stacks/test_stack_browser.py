"""The stack's own front-end in headless Chromium: classic Notebook 6 (colab: ipywidgets 7's notebook
extension) or JupyterLab 4 (kaggle: ipywidgets 8.1.5). One notebook, run cell by cell:

live progress that changes while a launch runs (two screenshots at different moments differ, and
the final state is right), the wizard and the device-map view rendering and acting, a session
started and used, a failing cell whose traceback is the user's, and no "reporter failed" line.
Issue 41's points on the stack's own IPython: the session start cell's rows say which cell runs,
then count the cells run, then stopped (item 9); cells are named after their In [N] (item 2); an
interrupted one-shot launch ends in a short KeyboardInterrupt with each rank's line (item 3), its
chart's steps keep counting across bars (item 4) and a rank's full log opens as text (item 1); a
hang marks its culprit in its row (item 10).
The launch waits at steps 30 and 60 until the test creates a gate file: the moments are chosen by
condition, never by timing. Screenshots: artifacts/screenshots/stack-<stack>-*.png.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from tests.browser_helpers import (
    SHOTS,
    LabServer,
    chromium,
    new_page,
    open_notebook,
    wait_until,
    write_notebook,
)
from tests.stacks.classic_helpers import ClassicServer, open_classic
from tests.test_blame_flood_browser import HANG_CELL
from tests.test_device_map_browser import CELL as DEVICE_MAP_CELL
from tests.test_notebook_face_browser import ANSI, INTERNALS
from tests.test_notebook_face_browser import CELLS as ISSUE41_CELLS
from tests.test_notebook_face_browser import INTERRUPTED as ISSUE41_INTERRUPTED

INTERRUPTED_CELL = ISSUE41_CELLS[ISSUE41_INTERRUPTED]

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

if shutil.which("chromium") is None and not os.path.exists("/usr/bin/chromium"):
    pytest.skip("needs Debian's chromium (scripts/test.sh installs it)", allow_module_level=True)

SETUP = """%load_ext accel_nb
import os, time
from accel_nb import notebook_launcher, progress, config_wizard
GATES = os.path.abspath(".")

def train():
    bar = progress(range(100), desc="train")
    for i in bar:
        if i in (30, 60):
            bar.refresh()  # send n = i now: the loop is about to wait for the test
            while not os.path.exists(os.path.join(GATES, f"gate{i}")):
                time.sleep(0.02)
    return int(os.environ["RANK"])
"""
CELLS = [
    SETUP,
    "results = notebook_launcher(train, num_processes=2, cpu=True)\nprint('results', results)",
    "wizard = config_wizard('wizard_config.yaml')\nwizard",
    DEVICE_MAP_CELL,
    "%accelerate start -n 2",
    # runs on the workers until the test has looked at the start cell's rows (issue 41, item 9)
    "%%accelerate\nimport os, time\nfrom accel_nb import PartialState\nwhile not os.path.exists('trained'):  # the test creates it (cwd: the notebook's folder)\n"
    "    time.sleep(0.05)\nscaled = PartialState().process_index * 10\nprint('scaled on this rank', scaled)",
    "%accelerate pull scaled --rank 1\nprint('pulled', scaled)\n%accelerate stop",
    "%%accelerate -n 2\nvalue = 1\nraise ValueError(f'bad value {value}')",
    # issue 41, items 3 and 4: three epochs' bars with set_postfix losses, then both ranks wait to be interrupted
    INTERRUPTED_CELL,
    HANG_CELL,  # item 10
]
LAUNCH, WIZARD, DEVICE_MAP, START, SESSION_CELL, PULL, FAILING, INTERRUPTED, HANG = range(1, 10)
PROBLEMS = ("reporter failed", "the progress widget could not", "display failed to start")


class Classic:
    """Classic Notebook 6 driven through its page's ``Jupyter.notebook``."""

    def __init__(self, root: str) -> None:
        self.server = ClassicServer(root, log_path=os.path.join(SHOTS, "..", "stack-classic-notebook.log"))

    def open(self, page, notebook: str) -> None:
        open_classic(page, self.server, notebook)

    def run(self, page, i: int) -> None:
        page.evaluate("i => Jupyter.notebook.execute_cells([i])", i)

    def done(self, page, i: int) -> bool:
        return bool(
            page.evaluate(
                "i => { const n = Jupyter.notebook.get_cell(i).input_prompt_number; "
                "return typeof n === 'number'; }",
                i,
            )
        )

    def outputs(self, page, i: int) -> list:
        return page.evaluate("i => Jupyter.notebook.get_cell(i).output_area.toJSON()", i)

    def node(self, page, i: int):
        return page.locator("#notebook-container .cell").nth(i)

    def prompt(self, page, i: int) -> int:
        return page.evaluate("i => Jupyter.notebook.get_cell(i).input_prompt_number", i)

    def interrupt(self, page) -> None:  # the toolbar's stop button
        page.evaluate("() => Jupyter.notebook.kernel.interrupt()")


class Lab:
    """JupyterLab 4 driven through ``window.jupyterapp``."""

    def __init__(self, root: str) -> None:
        self.server = LabServer(root, log_path=os.path.join(SHOTS, "..", "stack-jupyterlab.log"))

    def open(self, page, notebook: str) -> None:
        open_notebook(page, self.server, notebook)

    def run(self, page, i: int) -> None:
        page.evaluate(
            """i => { const panel = window.jupyterapp.shell.currentWidget;
            panel.content.activeCellIndex = i;
            window.jupyterapp.commands.execute('notebook:run-cell'); }""",
            i,
        )

    def done(self, page, i: int) -> bool:
        return bool(
            page.evaluate(
                """i => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i];
            return /\\[\\d+\\]/.test(cell.node.querySelector('.jp-InputPrompt').textContent); }""",
                i,
            )
        )

    def outputs(self, page, i: int) -> list:
        return page.evaluate(
            """i => { const cell = window.jupyterapp.shell.currentWidget.content.widgets[i];
            const out = []; for (let j = 0; j < cell.model.outputs.length; j++) out.push(cell.model.outputs.get(j).toJSON());
            return out; }""",
            i,
        )

    def node(self, page, i: int):
        return page.locator(".jp-Notebook .jp-Cell").nth(i)

    def prompt(self, page, i: int) -> int:
        return int(
            re.search(r"\[(\d+)\]", self.node(page, i).locator(".jp-InputPrompt").inner_text()).group(1)
        )

    def interrupt(self, page) -> None:  # the toolbar's stop button
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")


def _text(outputs: list) -> str:
    parts = []
    for out in outputs:
        parts.append(out.get("text", "") if isinstance(out.get("text", ""), str) else "".join(out["text"]))
        parts.append("\n".join(out.get("traceback", [])))
        plain = out.get("data", {}).get("text/plain", "")
        parts.append(plain if isinstance(plain, str) else "".join(plain))
    return "\n".join(parts)


def _widths(node) -> list[str]:
    return node.evaluate(
        "n => [...n.querySelectorAll('.widget-hprogress .progress-bar')].map(b => b.style.width)"
    )


def _shot(node, stack: str, name: str) -> str:
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, f"stack-{stack}-{name}.png")
    node.scroll_into_view_if_needed()
    node.screenshot(path=path)
    return path


def test_the_notebook_face_in_the_stacks_front_end(tmp_path, stack):
    root = str(tmp_path)
    os.makedirs(SHOTS, exist_ok=True)
    write_notebook(os.path.join(root, "stack.ipynb"), CELLS)
    front = Classic(root) if stack == "colab" else Lab(root)
    with front.server, chromium() as browser:
        page = new_page(browser)
        front.open(page, "stack.ipynb")

        def run(i: int, timeout: float = 180) -> None:
            front.run(page, i)
            wait_until(lambda: front.done(page, i), timeout, f"cell {i} to finish")

        def shows(i: int, text: str, timeout: float = 60) -> str:
            """Wait until cell ``i``'s outputs hold ``text`` (a cell's reply may come before its last output)."""
            wait_until(lambda: text in _text(front.outputs(page, i)), timeout, f"cell {i} to show {text!r}")
            return _text(front.outputs(page, i))

        run(0)
        # live progress: the bars stand at 30 %, then at 60 %, while the launch runs; then at 100 %, green
        front.run(page, LAUNCH)
        node = front.node(page, LAUNCH)
        shots = []
        for gate in (30, 60):
            wait_until(lambda gate=gate: _widths(node) == [f"{gate}%"] * 2, 120, f"both bars at {gate}%")
            assert not front.done(page, LAUNCH)  # still running
            shots.append(_shot(node, stack, f"progress-{gate}"))
            open(os.path.join(root, f"gate{gate}"), "w").close()
        wait_until(lambda: front.done(page, LAUNCH), 120, "the launch to finish")
        wait_until(lambda: _widths(node) == ["100%", "100%"], 30, "both bars at 100%")
        wait_until(lambda: node.locator(".progress-bar-success").count() == 2, 30, "both bars green (done)")
        shows(LAUNCH, "results [0, 1]")
        assert "done" in node.inner_text()
        shots.append(_shot(node, stack, "progress-done"))
        assert len({open(p, "rb").read() for p in shots}) == 3  # three moments, three different pictures
        # the wizard: rendered, and its Save writes the file with the value typed in
        run(WIZARD, 60)
        wizard = front.node(page, WIZARD)
        wait_until(lambda: wizard.locator("button", has_text="Save").count() == 1, 60, "the wizard to render")
        processes = wizard.locator(".widget-text input").first
        processes.fill("2")
        processes.press("Enter")
        wait_until(lambda: "--num_processes 2" in wizard.inner_text(), 30, "the commands to follow the value")
        wizard.locator("button", has_text="Save").click()
        wait_until(lambda: "Saved to" in wizard.inner_text(), 30, "the wizard's Save")
        assert "num_processes: 2" in open(os.path.join(root, "wizard_config.yaml")).read()
        _shot(wizard, stack, "wizard")
        # the device map: bars per device; a bigger CPU budget typed into the slider empties the disk bar
        run(DEVICE_MAP, 120)
        dmap = front.node(page, DEVICE_MAP)
        wait_until(lambda: dmap.locator(".accel-nb-device-bar").count() == 2, 60, "the device bars")
        disk = dmap.locator('.accel-nb-device-bar[data-device="disk"] .accel-nb-module')
        assert disk.count() >= 1
        # "Why blocks moved on" folds with its marker (Notebook 6's stylesheet hid it: summary as a block)
        summary = dmap.locator("details.accel-nb-moves > summary").first
        assert summary.evaluate("e => getComputedStyle(e).display") == "list-item"
        _shot(dmap, stack, "device-map-before")
        readout = dmap.locator(".accel-nb-budget-slider .widget-readout").first
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type("100000")
        page.keyboard.press("Enter")
        wait_until(lambda: disk.count() == 0, 60, "the disk bar to empty after the budget moved")
        _shot(dmap, stack, "device-map-after")
        # a session: started, a cell run on its ranks, a value pulled back, stopped
        run(START)
        shows(START, "%%accelerate cells now run on these workers")
        # issue 41, item 9: the start cell's rows say which cell runs, then idle with the count, then stopped
        start = front.node(page, START)
        front.run(page, SESSION_CELL)
        wait_until(lambda: "running cell" in start.inner_text(), 120, "the start view to say a cell runs")
        text = start.inner_text()
        assert "ready (idle" not in text and len(re.findall(r"\brunning\b", text)) >= 3, text
        _shot(start, stack, "session-busy")
        open(os.path.join(root, "trained"), "w").close()
        wait_until(lambda: front.done(page, SESSION_CELL), 120, "the session cell to finish")
        assert f"running cell {front.prompt(page, SESSION_CELL)} (its" in text, text  # named after its In [N]
        shows(SESSION_CELL, "[rank 1] scaled on this rank 10")
        wait_until(lambda: "| 1 cell run" in start.inner_text(), 60, "the start view's count of cells run")
        run(PULL, 120)
        shows(PULL, "pulled 10")
        shows(PULL, "the session was stopped")
        wait_until(lambda: "2 ranks: stopped" in start.inner_text(), 60, "the start view to say stopped")
        assert "0 cells run" not in start.inner_text()
        _shot(start, stack, "session-stopped")
        # a failing cell: the error output holds the user's frames only
        run(FAILING, 180)
        wait_until(
            lambda: any(o["output_type"] == "error" for o in front.outputs(page, FAILING)), 60, "the error"
        )
        errors = [o for o in front.outputs(page, FAILING) if o["output_type"] == "error"]
        assert len(errors) == 1 and errors[0]["ename"] == "LaunchError", errors
        tb = "\n".join(errors[0]["traceback"])
        # issue 41, item 2: the cell is named after its In [N] (IPython 7.34 counted one less)
        assert f"<accelerate-cell-{front.prompt(page, FAILING)}>" in tb and "bad value" in tb, tb
        for internal in ("interactiveshell", "decorator", "magic.py", "accel_nb/", "IPython/core"):
            assert internal not in tb, (internal, tb)
        _shot(front.node(page, FAILING), stack, "failing-cell")
        # issue 41, items 3, 4 and 1: an interrupted one-shot launch; the chart; the kept log as text
        front.run(page, INTERRUPTED)
        node = front.node(page, INTERRUPTED)
        wait_until(
            lambda: "waiting for the interrupt" in _text(front.outputs(page, INTERRUPTED)),
            180,
            "the ranks waiting",
        )
        front.interrupt(page)
        wait_until(lambda: front.done(page, INTERRUPTED), 120, "the interrupted cell to end")
        # the reply (the cell is done) may come before the error output on another channel, as for FAILING
        wait_until(
            lambda: any(o["output_type"] == "error" for o in front.outputs(page, INTERRUPTED)),
            60,
            "the interrupted cell's error",
        )
        errors = [o for o in front.outputs(page, INTERRUPTED) if o["output_type"] == "error"]
        assert len(errors) == 1, errors
        shown = ANSI.sub("", "\n".join(errors[0]["traceback"]))
        assert "the launch was interrupted: every rank was stopped" in shown, shown
        cell = f"<accelerate-cell-{front.prompt(page, INTERRUPTED)}>"
        for rank in (0, 1):
            assert re.search(rf"rank {rank}: at .*line \d+ of {re.escape(cell)}", shown), shown
        for internal in INTERNALS + ("decorator", "magic.py"):
            assert internal not in shown, (internal, shown)
        assert len(shown.splitlines()) < 25, shown
        wait_until(lambda: node.locator(".jupyter-widgets img").first.is_visible(), 60, "the chart")
        text = node.inner_text()
        _shot(node, stack, "interrupt-and-chart")
        for rank in (0, 1):  # steps kept counting across the three bars: 3 x 8
            assert re.search(rf"rank {rank}: \d+ pts, last 0\.04\d* at step 24", text), text
        node.get_by_text("rank 1 output").first.click()
        node.locator("button", has_text="Show rank 1's full log").click()
        log = node.locator(".accel-nb-full-log", has=page.locator("pre"))
        wait_until(
            lambda: log.count() == 1 and "waiting for the interrupt" in log.inner_text(), 60, "the log"
        )
        _shot(node, stack, "full-log")
        # item 10: the hang's culprit is marked in its own row
        run(HANG, 180)
        shows(HANG, "LaunchError caught:")
        hang = front.node(page, HANG)
        text = hang.inner_text()
        assert re.search(r"rank 1\s+hung \(likely cause\)", text) and re.search(r"rank 0\s+stopped", text), (
            text
        )
        _shot(hang, stack, "hang")
        # the kernel sends in order: every earlier cell's outputs are in by now
        others = [front.outputs(page, i) for i in range(len(CELLS)) if i not in (FAILING, INTERRUPTED)]
        assert [o["ename"] for outs in others for o in outs if o["output_type"] == "error"] == []
        everything = "\n".join(
            _text(outs) for outs in others + [front.outputs(page, i) for i in (FAILING, INTERRUPTED)]
        )
        assert not any(p in everything for p in PROBLEMS), everything
