"""The config wizard in a real JupyterLab + Chromium: issue 15 point 8 as a user sees it.

The "Proposed for this machine" label fits its button, the notebook_launcher line says cpu=True
like the other two lines, and an empty main-machine address is called empty (never "None").
Screenshots land in artifacts/screenshots/ (wizard_cpu_lines.png, wizard_empty_address.png).
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
]


def _notebook() -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
             for src in CELLS]  # fmt: skip
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
            "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}  # fmt: skip


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
