"""Screenshots of issue 41's items that the browser tests do not photograph, in JupyterLab 4 (Chromium).

    .venv/bin/python tests/scripts/issue41_screens.py      # ~2-3 min; artifacts/screenshots/issue41-*.png

Item 5: the parallelism notebook's first cell and its TP x FSDP cell; item 6: a session cell stuck in a
collective, interrupted; item 7 (and 8): a failing %%accelerate cell; item 11: the quickstart's tracked
launch; item 12: the device-map view. Items 1-4, 9 and 10 are photographed by
tests/test_notebook_face_browser.py, test_widget_truth_browser.py, test_blame_flood_browser.py and the
stack test. A script, not a test: it asserts nothing but that each cell ran; look at the pictures.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.browser_helpers import (  # noqa: E402 - after the path
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
from tests.test_device_map_browser import CELL as DEVICE_MAP_CELL  # noqa: E402

STUCK = (
    "%%accelerate\nimport time, torch\nprint('waiting on', torch.distributed.get_rank(), flush=True)\n"
    "if torch.distributed.get_rank() == 0:\n    torch.distributed.all_reduce(torch.ones(1))\n"
    "else:\n    time.sleep(120)\n"
)
EXTRAS = [
    "%load_ext accel_nb",
    "%%accelerate -n 2\nvalue = 1\nraise ValueError(f'bad value {value}')",  # items 7 and 8
    DEVICE_MAP_CELL,  # item 12
    "%accelerate start -n 2 --cpu",
    STUCK,  # item 6
    "%accelerate stop",
]


def code_cells(path: str, keep=None) -> list[str]:
    with open(path) as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    return sources if keep is None else [sources[i] for i in keep]


def shot(node, name: str) -> None:
    node.scroll_into_view_if_needed()
    node.screenshot(path=os.path.join(SHOTS, f"issue41-{name}.png"))
    print("wrote", os.path.join(SHOTS, f"issue41-{name}.png"))


def main() -> None:
    os.makedirs(SHOTS, exist_ok=True)
    root = tempfile.mkdtemp(prefix="accel_nb-issue41-")
    notebooks = os.path.join(ROOT, "notebooks")
    write_notebook(os.path.join(root, "extras.ipynb"), EXTRAS)
    write_notebook(
        os.path.join(root, "parallelism.ipynb"),
        code_cells(os.path.join(notebooks, "parallelism.ipynb"), [0, 1]),
    )
    write_notebook(
        os.path.join(root, "quickstart.ipynb"), code_cells(os.path.join(notebooks, "quickstart.ipynb"))
    )
    try:
        with LabServer(root) as lab, chromium() as browser:
            page = new_page(browser)
            cells = page.locator(".jp-Notebook .jp-Cell")

            def run(i: int, timeout: float = 300) -> None:
                run_cell(page, i)
                wait_until(lambda: cell_done(page, i), timeout, f"cell {i} to finish")

            open_notebook(page, lab, "extras.ipynb")
            for i in range(3):
                run(i)
            shot(cells.nth(1), "7-8-failing-cell")
            shot(cells.nth(2), "12-device-map")
            run(3)
            run_cell(page, 4)
            wait_until(lambda: "waiting on" in outputs_text(cell_outputs(page, 4)), 180, "the stuck cell")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
            wait_until(lambda: cell_done(page, 4), 180, "the interrupted cell")
            shot(cells.nth(4), "6-session-interrupt")
            run(5)
            lab.shutdown_kernels()
            page.context.close()

            page = new_page(browser)
            cells = page.locator(".jp-Notebook .jp-Cell")
            open_notebook(page, lab, "parallelism.ipynb")
            run(0)
            shot(cells.nth(0), "5-parallelism-first-cell")
            print(
                "parallelism notebook, first cell's outputs:", cell_outputs(page, 0)
            )  # [] when nothing shows
            run(1, 600)
            shot(cells.nth(1), "5-parallelism-tp-fsdp")
            lab.shutdown_kernels()
            page.context.close()

            page = new_page(browser)
            cells = page.locator(".jp-Notebook .jp-Cell")
            open_notebook(page, lab, "quickstart.ipynb")
            for i in range(5):  # up to the tracked launch (train_logged)
                run(i)
            shot(cells.nth(4), "11-quickstart-tracked-launch")
            shot(cells.nth(4).locator(".jp-OutputArea-child").last, "11-quickstart-printed")
            page.context.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
