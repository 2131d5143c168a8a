"""The widgets in a real browser: JupyterLab on 127.0.0.1, Debian's Chromium driven by Playwright.

One JupyterLab server and one browser for the whole module (TESTING.md section 3). The notebooks
are copied to a temporary folder so running them never writes outputs into notebooks/.
Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.browser_helpers import (
    ROOT,
    SHOTS,
    LabServer,
    cell_errors,
    chromium,
    new_page,
    open_notebook,
    run_all_cells,
    screenshot,
    start_all_cells,
    wait_until,
    write_notebook,
)
from tests.test_progress_kernel import stuck_cell

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    for name in os.listdir(os.path.join(ROOT, "notebooks")):
        if name.endswith(".ipynb"):
            shutil.copy(os.path.join(ROOT, "notebooks", name), root / name)
    os.makedirs(SHOTS, exist_ok=True)
    server = LabServer(str(root), log_path=os.path.join(SHOTS, "..", "jupyterlab.log"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture()
def page(browser):
    pg = new_page(browser)
    yield pg
    pg.context.close()


def cell_index(page, needle: str) -> int:
    """Index of the first cell whose source contains ``needle``."""
    index = page.evaluate(
        """needle => window.jupyterapp.shell.currentWidget.content.widgets
            .findIndex(c => c.model.sharedModel.getSource().includes(needle))""",
        needle,
    )
    assert index >= 0, f"no cell contains {needle!r}"
    return index


def cell(page, needle: str):
    node = page.locator(".jp-Notebook .jp-Cell").nth(cell_index(page, needle))
    node.scroll_into_view_if_needed()
    return node


def progress_widths(node) -> list[str]:
    return node.evaluate(
        "n => [...n.querySelectorAll('.widget-hprogress .progress-bar')].map(b => b.style.width)"
    )


def test_quickstart_progress_bars_reach_100_percent(lab, page):
    open_notebook(page, lab, "quickstart.ipynb")
    run_all_cells(page, lab, "quickstart.ipynb")
    assert cell_errors(page) == []
    for needle, name in (("notebook_launcher(train", "launcher"), ("%%accelerate --num_processes", "magic")):
        node = cell(page, needle)
        # one bar per rank, both full once the launch is over
        widths = wait_until(
            lambda node=node: (w := progress_widths(node)) and all(x == "100%" for x in w) and w,
            30,
            f"the {name} cell's bars to reach 100%",
        )
        assert widths == ["100%", "100%"], widths
        text = node.inner_text()
        assert "rank 0" in text and "rank 1" in text and "done" in text
        node.screenshot(path=os.path.join(SHOTS, f"quickstart_progress_{name}.png"))
    # the failing launch: rank 1 is shown failed with its exception, rank 0 is not
    failing = cell(page, "notebook_launcher(fails_on_rank_1")
    text = failing.inner_text()
    assert "failed" in text and "ValueError" in text and "boom on rank 1" in text
    assert "caught: rank 1 failed with ValueError: boom on rank 1" in text
    failing.screenshot(path=os.path.join(SHOTS, "quickstart_failure.png"))
    # the tracked launch drew its logged loss as curves under the bars
    tracked = cell(page, "notebook_launcher(train_logged")
    wait_until(
        lambda: tracked.evaluate(
            "n => [...n.querySelectorAll('.jp-OutputArea-output img')].some(i => i.naturalWidth > 0)"
        ),
        30,
        "the launch's curves",
    )
    tracked.screenshot(path=os.path.join(SHOTS, "quickstart_tracking.png"))
    # the results came back and were plotted
    plot = cell(page, "ax.plot(history")
    assert plot.locator(".jp-RenderedImage img").count() == 1  # drawn from the values --return brought back
    assert "trained model (back in this notebook): Sequential" in cell(page, "final_mse").inner_text()
    screenshot(page, "quickstart_end", SHOTS)


def test_device_map_view_has_a_bar_per_device_and_follows_the_budget_slider(lab, page):
    open_notebook(page, lab, "big_model_inference.ipynb")
    run_all_cells(page, lab, "big_model_inference.ipynb")
    assert cell_errors(page) == []
    node = cell(page, "view = show_device_map(")

    def modules_per_device():
        return dict(
            node.evaluate(
                """n => [...n.querySelectorAll('.accel-nb-device-bar')]
                .map(b => [b.dataset.device, b.querySelectorAll('.accel-nb-module').length])"""
            )
        )

    before = modules_per_device()
    assert set(before) == {"cpu", "disk"}  # one bar per device, named separately
    assert before["cpu"] > 0 and before["disk"] > 0  # the 1.2 MB CPU budget sent blocks to disk
    # hovering a block names its module path; the table lists module -> device. With 1.2 MB the CPU keeps
    # room for the largest block (the reference's rule), so every GPT2Block goes to disk, as one entry
    block = node.locator(
        '.accel-nb-device-bar[data-device="disk"] .accel-nb-module[data-module="transformer.h"]'
    )
    assert "transformer.h" in block.get_attribute("title")
    assert (
        node.locator('.accel-nb-device-table tr[data-module="transformer.h"][data-device="disk"]').count()
        == 1
    )
    node.screenshot(path=os.path.join(SHOTS, "device_map_before.png"))
    # raise the CPU budget to the slider's maximum: everything fits on the CPU, the disk empties
    handle = node.locator(".accel-nb-budget-slider-cpu .noUi-handle")
    assert handle.count() == 1
    handle.focus()
    page.keyboard.press("End")
    after = wait_until(
        lambda: (m := modules_per_device()) and m.get("disk") == 0 and m, 30, "the map to be recomputed"
    )
    assert after["cpu"] > 0 and set(after) == {"cpu", "disk"}
    node.screenshot(path=os.path.join(SHOTS, "device_map_after.png"))
    # and back down to the minimum budget: nothing on the CPU, all on disk
    handle.focus()
    page.keyboard.press("Home")
    low = wait_until(
        lambda: (m := modules_per_device()) and m.get("cpu") == 0 and m, 30, "the map to move to disk"
    )
    assert low["disk"] > 0
    time.sleep(0.2)


def test_config_wizard_controls_validate_and_save_writes_the_file(lab, page):
    open_notebook(page, lab, "config_wizard.ipynb")
    run_all_cells(page, lab, "config_wizard.ipynb")
    assert cell_errors(page) == []
    printed = cell(page, 'os.environ["ACCEL_NB_CONFIG_FILE"]').inner_text()
    path = printed.split("config file for this notebook: ", 1)[1].split()[0]
    assert "num_processes: 2" in open(path).read()  # the notebook's own set_values + save
    node = cell(page, "wizard = config_wizard()")
    save = node.locator("button:has-text('Save')")
    processes = node.locator(".widget-text:has(label:text-is('Processes (all machines)')) input")
    # an impossible value: the error names the key and Save is disabled
    processes.fill("0")
    processes.press("Tab")
    wait_until(save.is_disabled, 30, "Save to be disabled for num_processes=0")
    assert "num_processes" in node.inner_text()
    node.screenshot(path=os.path.join(SHOTS, "wizard_invalid.png"))
    # valid values: the equivalent commands follow, Save writes them
    processes.fill("3")
    processes.press("Tab")
    node.locator(".widget-dropdown:has(label:text-is('Notebook start method')) select").select_option("spawn")
    wait_until(
        lambda: "--num_processes 3" in node.inner_text() and "--start_method spawn" in node.inner_text(),
        30,
        "the %%accelerate line to follow the controls",
    )
    assert not save.is_disabled()
    save.click()
    wait_until(lambda: f"Saved to {path}" in node.inner_text(), 30, "the Saved status")
    text = open(path).read()
    assert "num_processes: 3" in text and "start_method: spawn" in text
    node.screenshot(path=os.path.join(SHOTS, "wizard_saved.png"))


def test_stuck_ranks_turn_amber_and_count_their_quiet_seconds(lab, page):
    """Issue 15.3 in the browser: while ranks are stuck the rows say so, with a decaying rate."""
    write_notebook(
        os.path.join(lab.root_dir, "stall.ipynb"),
        [stuck_cell(reporter="WidgetReporter(2, stall_after=4)", gate=os.path.join(lab.root_dir, "wake"))],
    )
    open_notebook(page, lab, "stall.ipynb")
    start_all_cells(page)
    node = page.locator(".jp-Notebook .jp-Cell").nth(0)
    try:
        text = wait_until(
            lambda: (t := node.inner_text()).count("stalled") >= 2 and t.count("no progress for") >= 2 and t,
            90,
            "both rows to turn stalled",
        )
    except TimeoutError:
        screenshot(page, "progress_stalled_FAILED", SHOTS)
        raise AssertionError(f"the cell shows: {node.inner_text()!r}") from None
    assert text.count("no progress for") >= 2 and "ETA 0:00" not in text
    styles = node.evaluate(
        "n => [...n.querySelectorAll('.widget-hprogress .progress-bar')].map(b => b.className)"
    )
    assert len(styles) == 2 and all("warning" in s for s in styles), styles  # amber
    node.screenshot(path=os.path.join(SHOTS, "progress_stalled.png"))
    open(os.path.join(lab.root_dir, "wake"), "w").close()  # rank 1 stops waiting: the launch can end
    wait_until(lambda: node.inner_text().count("done") >= 2, 60, "the launch to finish once rank 1 wakes")
    node.screenshot(path=os.path.join(SHOTS, "progress_stalled_then_done.png"))
