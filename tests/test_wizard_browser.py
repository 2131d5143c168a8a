"""The config wizard in a real JupyterLab + Chromium: issue 15 point 8 as a user sees it.

The "Proposed for this machine" label fits its button, the notebook_launcher line says cpu=True
like the other two lines, and an empty main-machine address is called empty (never "None").
Screenshots land in artifacts/screenshots/ (wizard_cpu_lines.png, wizard_empty_address.png).
Issue 30: the parallel layout controls (FSDP × tensor/context parallel) and their inline error
(wizard_layout.png, wizard_layout_error.png, wizard_layout_narrow_700.png), and the progress widget's
rows with each rank's role (roles_widget.png), drawn from Role events without a launch.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.browser_helpers import LabServer, cell_errors, chromium, open_notebook, run_all_cells, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOTS = os.path.join(ROOT, "artifacts", "screenshots")
NOTEBOOK = "wizard_details.ipynb"
CELLS = [
    "import os\nos.environ['ACCEL_NB_CONFIG_FILE'] = os.path.abspath('wizard.yaml')",
    "from accel_nb import config_wizard\nwizard = config_wizard()\nwizard.set_values(compute='cpu', num_processes=2)\nwizard",
    # issue 30: the layout, as a user who ticked FSDP and the layout on 4 CPU processes sees it
    "layout = config_wizard()\n"
    "layout.set_values(compute='cpu', num_processes=4, use_fsdp=True, use_parallelism_config=True, tp_size=2)\n"
    "layout",
    # each rank's role in the progress widget, from the Role events a 2 x 2 mesh's ranks send (no launch)
    "from accel_nb.events import Progress\n"
    "from accel_nb.notebook.live.progress_widget import WidgetReporter\n"
    "from accel_nb.parallel import ParallelismConfig\n"
    "from accel_nb.parallel.roles import mesh_role\n"
    "mesh = ParallelismConfig(dp_shard_size=2, tp_size=2)\n"
    "view = WidgetReporter(4, desc='train')\n"
    "view.start(4, {})\n"
    "for r in range(4):\n"
    "    view.handle(mesh_role(mesh, r))\n"
    "    view.handle(Progress(rank=r, name='train', n=3 + 2 * r, total=10))\n"
    "view.finish(ok=True)",
]


def _notebook() -> dict:
    cells = [
        {"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
        for src in CELLS
    ]
    return {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_wizard_label_cpu_line_and_empty_address_in_the_browser(tmp_path):
    (tmp_path / NOTEBOOK).write_text(json.dumps(_notebook()))
    os.makedirs(SHOTS, exist_ok=True)
    with LabServer(str(tmp_path)) as lab, chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        open_notebook(page, lab, NOTEBOOK)
        run_all_cells(page, lab, NOTEBOOK)
        assert cell_errors(page) == []
        node = page.locator(".jp-CodeCell").nth(1)
        reset = node.locator("button:has-text('Proposed for this machine')")
        reset.wait_for(timeout=60_000)
        # the whole label is drawn: the button is at least as wide as its text
        assert reset.evaluate("b => b.scrollWidth <= b.clientWidth"), "the button label is cut off"
        text = node.inner_text()
        assert "--cpu" in text and "cpu=True" in text
        node.screenshot(path=os.path.join(SHOTS, "wizard_cpu_lines.png"))
        machines = node.locator(".widget-text:has(label:text-is('Machines')) input")
        machines.fill("2")
        machines.press("Tab")
        wait_until(lambda: "main_process_ip is empty" in node.inner_text(), 30, "the empty-address error")
        assert "None" not in node.inner_text()
        node.screenshot(path=os.path.join(SHOTS, "wizard_empty_address.png"))

        # issue 30: the layout controls with FSDP on 4 processes, then sizes that do not divide them
        layout = page.locator(".jp-CodeCell").nth(2)
        tp = layout.locator(".widget-text:has(label:text-is('Tensor-parallel size')) input")
        tp.wait_for(timeout=60_000)
        for label in ("Context-parallel size", "Replicas (dp_replicate)"):
            assert layout.locator(f".widget-text:has(label:text-is('{label}')) input").is_visible(), label
        text = layout.inner_text()
        assert "FSDP shards over 2 processes: dp_replicate=1 × dp_shard=2 × cp=1 × tp=2" in text
        assert (
            "--parallelism_config_tp_size 2" in text
            and "ParallelismConfig(dp_shard_size=2, tp_size=2)" in text
        )
        layout.screenshot(path=os.path.join(SHOTS, "wizard_layout.png"))
        tp.fill("3")
        tp.press("Tab")
        wait_until(lambda: "does not divide the 4 processes" in layout.inner_text(), 30, "the layout error")
        assert "tp_size 3 × cp_size 1 × dp_replicate_size 1 = 3" in layout.inner_text()
        assert layout.locator("button:has-text('Save')").is_disabled()
        layout.screenshot(path=os.path.join(SHOTS, "wizard_layout_error.png"))

        # the progress widget: each rank's role under its label, the bars lined up
        roles = page.locator(".jp-CodeCell").nth(3)
        roles.locator(".widget-hprogress").nth(3).wait_for(timeout=60_000)
        for rank, role in enumerate(("dp 0 · tp 0", "dp 0 · tp 1", "dp 1 · tp 0", "dp 1 · tp 1")):
            assert role in roles.locator(f".widget-html:has-text('rank {rank}')").first.inner_text()
        bars = roles.locator(".widget-hprogress").evaluate_all(
            "els => els.map(e => Math.round(e.getBoundingClientRect().left))"
        )
        assert len(bars) == 4 and len(set(bars)) == 1, bars
        roles.screenshot(path=os.path.join(SHOTS, "roles_widget.png"))


def test_wizard_in_a_700px_window_keeps_the_slider_value_and_whole_flags(tmp_path):
    """Issue 27: at 700 px the slider's value was cut off and the commands broke in the middle of a flag."""
    (tmp_path / NOTEBOOK).write_text(json.dumps(_notebook()))
    os.makedirs(SHOTS, exist_ok=True)
    with LabServer(str(tmp_path)) as lab, chromium() as browser:
        page = browser.new_context(viewport={"width": 700, "height": 1200}).new_page()
        open_notebook(page, lab, NOTEBOOK)
        run_all_cells(page, lab, NOTEBOOK)
        assert cell_errors(page) == []
        node = page.locator(".jp-CodeCell").nth(1)
        commands = node.locator(".accel-nb-wizard-commands")
        commands.wait_for(timeout=60_000)
        node.screenshot(path=os.path.join(SHOTS, "wizard_narrow_700.png"))  # looked at; before the checks
        area = node.locator(".jp-OutputArea-output").last.bounding_box()
        right = area["x"] + area["width"]
        readout = node.locator(".widget-hslider .widget-readout").first
        box = readout.bounding_box()
        assert box is not None and box["width"] > 0 and box["x"] + box["width"] <= right + 1, (box, area)
        assert readout.evaluate("r => r.scrollWidth <= r.clientWidth + 1"), "the slider's value is cut off"
        # each flag with its value is one unbroken line (a broken piece is two lines tall)
        pieces = commands.locator("span")
        heights = pieces.evaluate_all("els => els.map(e => [e.textContent, e.getClientRects().length])")
        broken = [text for text, rects in heights if rects != 1]
        assert heights and not broken, broken
        inner = commands.evaluate("c => [c.scrollWidth, c.clientWidth]")
        assert inner[0] <= inner[1] + 1, f"the commands overflow the cell: {inner}"
        assert "--cpu" in commands.inner_text()
        status = node.locator("text=Save writes").first
        assert status.evaluate("s => s.scrollWidth <= s.clientWidth + 1"), "the status line's path is cut off"
        # issue 30: the layout controls fit a narrow cell too
        layout = page.locator(".jp-CodeCell").nth(2)
        summary = layout.locator("text=FSDP shards over").first
        summary.wait_for(timeout=60_000)
        layout.screenshot(path=os.path.join(SHOTS, "wizard_layout_narrow_700.png"))
        area = layout.locator(".jp-OutputArea-output").last.bounding_box()
        tp = layout.locator(".widget-text:has(label:text-is('Tensor-parallel size')) input").bounding_box()
        assert tp["x"] + tp["width"] <= area["x"] + area["width"] + 1, (tp, area)
        assert summary.evaluate("s => s.scrollWidth <= s.clientWidth + 1"), "the layout line is cut off"
        for box in ("Shard with FSDP2", "Parallel layout"):  # the checkbox labels are whole
            label = layout.locator(f".widget-checkbox:has-text('{box}') label").first
            assert label.evaluate("l => l.scrollWidth <= l.clientWidth + 1"), f"{box!r} is cut off"
        # the ParallelismConfig(...) comments break after ( and , : nothing runs past the cell
        inner = layout.locator(".accel-nb-wizard-commands").evaluate("c => [c.scrollWidth, c.clientWidth]")
        assert inner[0] <= inner[1] + 1, f"the commands overflow the cell: {inner}"
