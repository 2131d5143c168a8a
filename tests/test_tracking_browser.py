"""The live metric curves in a real browser: JupyterLab + Chromium, a 2-rank launch that logs.

Screenshots (look at them): artifacts/screenshots/tracking_curves_live.png (mid-run) and
tracking_curves_done.png (the finished launch).
"""

from __future__ import annotations

import os

import pytest

from tests.browser_helpers import (
    SHOTS,
    LabServer,
    cell_errors,
    chromium,
    new_page,
    open_notebook,
    screenshot,
    start_all_cells,
    wait_until,
    write_notebook,
)

pytest.importorskip("matplotlib")
pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

STEPS = 60
CELL = f"""
import math, time
from accel_nb import Accelerator, notebook_launcher, progress

def train():
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    bar = progress(range({STEPS}), desc="train")
    for step in bar:
        time.sleep(0.1)
        loss = math.exp(-step / 15) * (1 + 0.3 * rank) + 0.02 * math.sin(step + rank)
        accelerator.log({{"loss": loss, "lr": 0.1 * (1 - step / {STEPS})}}, step=step)
        bar.set_postfix(grad_norm=1 + 0.5 * math.cos(step / 5 + rank))
    return rank

notebook_launcher(train, num_processes=2, cpu=True)
"""


def chart_images(node) -> list[dict]:
    """The chart images in a cell: their natural size (0 while not loaded)."""
    return node.evaluate(
        "n => [...n.querySelectorAll('.jp-OutputArea-output img')].map(i => ({w: i.naturalWidth, h: i.naturalHeight}))"
    )


def test_the_progress_widget_draws_live_curves_per_rank(tmp_path):
    os.makedirs(SHOTS, exist_ok=True)
    write_notebook(str(tmp_path / "curves.ipynb"), [CELL])
    with (
        LabServer(str(tmp_path), log_path=os.path.join(SHOTS, "..", "jupyterlab_tracking.log")) as lab,
        chromium() as browser,
    ):
        page = new_page(browser)
        open_notebook(page, lab, "curves.ipynb")
        start_all_cells(page)
        node = page.locator(".jp-Notebook .jp-Cell").nth(0)
        # mid-run: a picture is shown while the bars are still moving
        wait_until(
            lambda: any(i["w"] > 0 for i in chart_images(node)) and "running" in node.inner_text(),
            90,
            "the chart to appear while the ranks run",
        )
        node.screenshot(path=os.path.join(SHOTS, "tracking_curves_live.png"))
        try:
            # every rank's last point: a rank's final events may reach the view just after the launch ends
            wait_until(
                lambda: (
                    node.inner_text().count("done") >= 2
                    and all(f"rank {r}: {STEPS} pts" in node.inner_text() for r in (0, 1))
                ),
                120,
                "the launch to finish with every point drawn",
            )
        except TimeoutError:
            screenshot(page, "tracking_curves_FAILED", SHOTS)
            raise AssertionError(f"the cell shows: {node.inner_text()!r}") from None
        assert cell_errors(page) == []
        text = node.inner_text()
        for rank in (0, 1):
            assert f"rank {rank}: {STEPS} pts" in text, text
        assert "grad_norm" in text and "lr" in text
        (image,) = [i for i in chart_images(node) if i["w"] > 0]
        assert image["w"] > 500 and image["h"] > 150
        node.screenshot(path=os.path.join(SHOTS, "tracking_curves_done.png"))
