"""The hang blame and the print flood as a user sees them: JupyterLab, the live widget, Chromium.

The hang's culprit rank is marked in its own row (issue 41, item 10). Screenshots land in
artifacts/screenshots/ (hang_blame.png, flood_tail.png): look at them.
"""

from __future__ import annotations

import os
import re

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
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

HANG_CELL = """
import os, tempfile, time, torch, torch.distributed
from accel_nb import LaunchError, PartialState, notebook_launcher

def train(flag):
    if PartialState().process_index == 1:
        while not os.path.exists(flag):  # busy (printing) until rank 0 is about to wait in the collective
            print("working", flush=True)
            time.sleep(0.2)
        time.sleep(600)
    open(flag, "w").close()
    torch.distributed.all_reduce(torch.ones(1))

try:
    notebook_launcher(train, args=(os.path.join(tempfile.mkdtemp(), "entering"),), num_processes=2, cpu=True, timeout=3)
except LaunchError as err:
    print("LaunchError caught:", err.headline)
"""

FLOOD_CELL = """
def flood():
    for i in range(200_000):
        print("line", i)
    print("FINAL LINE")

notebook_launcher(flood, num_processes=2, cpu=True)
"""


# scroll the notebook so the first shown "FINAL LINE" of the output is in view (inside one long <pre>)
SCROLL_TO_FINAL_LINE = """n => {
    const walker = document.createTreeWalker(n, NodeFilter.SHOW_TEXT);
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
        const i = t.data.indexOf('FINAL LINE');
        if (i < 0) continue;
        if (!t.parentElement || t.parentElement.getClientRects().length === 0) continue;  // a folded log pane
        const mark = document.createElement('span');  // an empty mark just before the text, to scroll to
        t.parentNode.insertBefore(mark, t.splitText(i));
        mark.scrollIntoView({block: 'center'});
        return true;
    }
    return false;
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    os.makedirs(SHOTS, exist_ok=True)
    server = LabServer(str(root))
    server.start()
    yield server
    server.stop()


def test_hang_blame_and_flood_in_jupyterlab(lab):
    write_notebook(os.path.join(lab.root_dir, "blame_flood.ipynb"), [HANG_CELL, FLOOD_CELL])
    with chromium() as browser:
        page = new_page(browser)
        open_notebook(page, lab, "blame_flood.ipynb")
        run_all_cells(page, lab, "blame_flood.ipynb", timeout=300)
        assert not cell_errors(page), cell_errors(page)
        cells = page.locator(".jp-Notebook .jp-Cell")

        hang = cells.nth(0)
        hang.scroll_into_view_if_needed()
        text = hang.inner_text()
        assert "rank 1 hung: no progress for" in text and "the likely cause at train, line" in text, text[
            -3000:
        ]
        assert "rank 0 waits in a collective (all_reduce); rank 1 is not: the likely cause" in text
        # the culprit's own row says so (issue 41, item 10); the rank that waited reads stopped
        assert re.search(r"rank 1\s+hung \(likely cause\)", text) and re.search(r"rank 0\s+stopped", text), (
            text
        )
        screenshot(page, "hang_blame", SHOTS)

        flood = cells.nth(1)
        out = flood.locator(".jp-OutputArea")
        text = out.inner_text()
        for rank in (0, 1):
            lines = re.findall(rf"^\[(?:rank {rank}|ranks 0,1)\] line \d+$", text, re.MULTILINE)
            assert 0 < len(lines) < 2000, len(lines)  # a bounded head and tail, not 200,000 lines
        assert re.search(r"^\[(rank \d|ranks 0,1)\] FINAL LINE$", text, re.MULTILINE), text[-2000:]
        assert "not shown so far" in text and "lines of the flood:" in text
        logs = set(re.findall(r"the full log is (\S+rank\d\.log)", text))
        assert len(logs) == 2 and all(os.path.exists(p) for p in logs), logs  # the note's files exist
        assert out.evaluate(SCROLL_TO_FINAL_LINE), "FINAL LINE is not on the page"
        screenshot(page, "flood_tail", SHOTS)
        page.context.close()
