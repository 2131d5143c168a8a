"""Issue 27's widget points as a user sees them: JupyterLab 4, the live widgets, Chromium.

A session's start widget says "running cell N" while a cell trains on the workers, "ready (idle)
... | N cells run" while they wait, then "stopped" after ``%accelerate stop`` (issue 41, item 9);
``view.set_budget`` moves the device-map slider. Screenshots land in artifacts/screenshots/
(session_busy.png, session_ready.png, session_stopped.png, device_map_set_budget.png): look at them.
"""

from __future__ import annotations

import os
import re
import tempfile

import pytest

from tests.browser_helpers import (
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

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    os.makedirs(SHOTS, exist_ok=True)
    server = LabServer(str(root))
    server.start()
    yield server
    server.stop()


def test_session_start_widget_says_busy_ready_then_stopped(lab):
    """The start cell's rows follow the session: running while a cell trains on the workers (issue 41,
    item 9), ready with the count of cells run, stopped after ``%accelerate stop``."""
    gates = tempfile.mkdtemp(prefix="accel_nb-stop-")
    trained, looked = os.path.join(gates, "trained"), os.path.join(gates, "looked")
    cells = [
        f"import sys\nsys.path.insert(0, {ROOT!r})\n%load_ext accel_nb\n%accelerate start -n 2 --cpu",
        # a cell "training" on the workers until the test has looked at the start cell
        f"%%accelerate\nimport os, time\nwhile not os.path.exists({trained!r}):\n    time.sleep(0.1)",
        "%%accelerate\nx = 1",
        f"import os, time\nwhile not os.path.exists({looked!r}):\n    time.sleep(0.1)",  # the test looks first
        "%accelerate stop",
    ]
    write_notebook(os.path.join(lab.root_dir, "session_truth.ipynb"), cells)
    with chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "session_truth.ipynb")
        start_all_cells(page)
        start = page.locator(".jp-Notebook .jp-Cell").nth(0)
        wait_until(
            lambda: "running cell 2 (its progress and output are in that cell)" in start.inner_text(),
            180,
            "the start widget to say cell 2 runs",
        )
        text = start.inner_text()
        assert "ready (idle" not in text and len(re.findall(r"\brunning\b", text)) >= 3, (
            text
        )  # 2 rows + summary
        start.scroll_into_view_if_needed()
        screenshot(page, "session_busy", SHOTS)
        open(trained, "w").close()
        wait_until(
            lambda: "| 2 cells run" in start.inner_text(), 120, "the start widget's count of cells run"
        )
        text = start.inner_text()
        assert re.search(r"2 ranks: ready \(idle", text) and text.count("ready (idle)") >= 2, text
        assert not re.search(r"\bdone\b", text) and "running" not in text, text
        screenshot(page, "session_ready", SHOTS)
        open(looked, "w").close()
        wait_until(lambda: start.inner_text().count("stopped") >= 3, 120, "the start widget's stopped rows")
        text = start.inner_text()
        assert "ready (idle)" not in text and "2 ranks: stopped (its workers ended)" in text, text
        assert "0 cells run" not in text, text  # no stale count (it said so after four cells and a stop)
        stop = page.locator(".jp-Notebook .jp-Cell").nth(4)
        wait_until(lambda: "the session was stopped" in stop.inner_text(), 60, "stop's answer")
        assert not cell_errors(page), cell_errors(page)
        start.scroll_into_view_if_needed()
        screenshot(page, "session_stopped", SHOTS)
        page.context.close()


DEVICE_MAP_CELL = f"""
import sys
sys.path.insert(0, {ROOT!r})
from torch import nn
from accel_nb import init_empty_weights, show_device_map, compute_module_sizes

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 64)) for _ in range(8))
        self.head = nn.Linear(64, 100)

with init_empty_weights():
    net = Net()
total = compute_module_sizes(net)[""]
view = show_device_map(net, max_memory={{"cpu": total // 2, "disk": "1GB"}}, no_split_module_classes=["Sequential"])
"""


def test_set_budget_moves_the_slider_and_neighbours_differ(lab):
    write_notebook(
        os.path.join(lab.root_dir, "map_truth.ipynb"), [DEVICE_MAP_CELL, "view.set_budget('cpu', '4MB');"]
    )
    with chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "map_truth.ipynb")
        run_all_cells(page, lab, "map_truth.ipynb")
        assert not cell_errors(page), cell_errors(page)
        readout = page.locator(".accel-nb-budget-slider .widget-readout").first
        unit = (
            page.locator(".accel-nb-budget-slider .widget-label").first.inner_text().split("(")[1].rstrip(")")
        )
        figure = {"KiB": 4e6 / 1024, "MiB": 4e6 / 1024**2}[unit]

        def shown() -> bool:  # to one decimal (the browser may round the half the other way)
            try:
                return abs(float(readout.inner_text().strip().replace(",", "")) - figure) <= 0.051
            except ValueError:
                return False

        wait_until(shown, 30, "the slider to show the 4MB budget")
        info = page.locator(".jp-OutputArea .accel-nb-device-info").first.inner_text()
        assert re.search(rf"/ {int(figure)}\.\d {unit} budget", info), info
        colours = page.evaluate(
            "() => [...document.querySelectorAll('.jp-OutputArea .accel-nb-device-bar')].map("
            "b => [...b.querySelectorAll('.accel-nb-module')].map(m => getComputedStyle(m).backgroundColor))"
        )
        assert colours and all(a != b for bar in colours for a, b in zip(bar, bar[1:])), colours
        page.locator(".accel-nb-budget-slider").first.scroll_into_view_if_needed()
        screenshot(page, "device_map_set_budget", SHOTS)
        page.context.close()


RESTART_CELL = f"""
import sys
sys.path.insert(0, {ROOT!r})
from accel_nb import notebook_launcher, progress

def slow():
    import time
    for _ in progress(range(1000), desc="train"):
        time.sleep(0.5)

notebook_launcher(slow, num_processes=2, cpu=True)
"""


def test_a_kernel_restart_during_a_launch_ends_the_widget_saying_so(lab):
    write_notebook(os.path.join(lab.root_dir, "restart_truth.ipynb"), [RESTART_CELL])
    with chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "restart_truth.ipynb")
        start_all_cells(page)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(0)
        wait_until(lambda: cell.inner_text().count("running") >= 2, 180, "both ranks running")
        # what Kernel > Restart Kernel does, without its confirmation dialog
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
        try:
            # JupyterLab drops what the old kernel sends once a restart is asked: the views, marked
            # disconnected by the frontend, show their static "gone" text (CSS), not "running · ETA"
            wait_until(
                lambda: "the kernel restarted or went away" in cell.inner_text(), 60, "the widget to say so"
            )
        finally:
            screenshot(page, "kernel_restart", SHOTS)
        text = cell.inner_text()
        assert "ETA" not in text and "running" not in text and text.count("stopped (kernel gone)") == 2, text
        cell.scroll_into_view_if_needed()
        screenshot(page, "kernel_restart", SHOTS)
        page.context.close()
