"""The config wizard's DeepSpeed box in a real JupyterLab + Chromium (issue 28): ticking it opens the
DeepSpeed settings, the stage shows only what applies, the commands follow, and Save writes the config.
Screenshot: artifacts/screenshots/wizard_deepspeed.png.
"""

from __future__ import annotations

import json
import os

import pytest

from accel_nb.config import load_config
from tests.browser_helpers import LabServer, cell_errors, chromium, open_notebook, run_all_cells, wait_until
from tests.test_deepspeed_launch import needs_deepspeed
from tests.test_wizard_browser import SHOTS, _notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

NOTEBOOK = "wizard_deepspeed.ipynb"


@needs_deepspeed
def test_wizard_deepspeed_box_in_the_browser(tmp_path):
    (tmp_path / NOTEBOOK).write_text(json.dumps(_notebook()))
    os.makedirs(SHOTS, exist_ok=True)
    with LabServer(str(tmp_path)) as lab, chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1400}).new_page()
        open_notebook(page, lab, NOTEBOOK)
        run_all_cells(page, lab, NOTEBOOK)
        assert cell_errors(page) == []
        node = page.locator(".jp-CodeCell").nth(1)
        tick = node.locator(".widget-checkbox:has-text('DeepSpeed ZeRO') input[type=checkbox]")
        tick.wait_for(timeout=60_000)
        stage = node.locator(".widget-dropdown:has(label:text-is('ZeRO stage')) select")
        params = node.locator(".widget-dropdown:has(label:text-is('Offload parameters')) select")
        compile_backend = node.locator(".widget-dropdown:has(label:text-is('torch.compile backend'))")
        assert not stage.is_visible() and compile_backend.is_visible()
        tick.check()
        wait_until(stage.is_visible, 30, "the DeepSpeed settings to open")
        assert (
            not params.is_visible() and not compile_backend.is_visible()
        )  # stage 2; no compile with DeepSpeed
        stage.select_option(label="3")
        wait_until(params.is_visible, 30, "the parameter offload to show at stage 3")
        params.select_option(label="cpu")
        wait_until(
            lambda: (
                "--use_deepspeed --zero_stage 3" in node.inner_text()
                and "--offload_param_device cpu" in node.inner_text()
            ),
            30,
            "the accel-nb launch line to follow the DeepSpeed controls",
        )
        assert "deepspeed_plugin=DeepSpeedPlugin(zero_stage=3" in node.inner_text()
        node.screenshot(path=os.path.join(SHOTS, "wizard_deepspeed.png"))
        node.locator("button:has-text('Save')").click()
        wait_until(lambda: "Saved to" in node.inner_text(), 30, "the Saved status")
        saved = load_config(str(tmp_path / "wizard.yaml"))
        assert saved.distributed_type == "DEEPSPEED" and saved.num_processes == 2
        assert saved.extras["deepspeed_config"]["zero_stage"] == 3
        assert saved.extras["deepspeed_config"]["offload_param_device"] == "cpu"
