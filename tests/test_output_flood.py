"""A print flood (200,000 lines per rank) leaves a bounded head, the flood's last lines and a log that exists.

The cell must not receive every line (it would be tens of thousands of pixels tall), must show the
final lines (a closing ``print('FINAL LINE')`` above all), and its note must name a log file that
is still there after the launch succeeded (kept until the next launch or the kernel ends).
"""

from __future__ import annotations

import io
import os
import re

from accel_nb import debug_launcher
from accel_nb.events import Dropped
from accel_nb.launch.parent.reporting import ListReporter, TextReporter
from accel_nb.launch.rank.capture import HEAD_LINES, TAIL_LINES
from tests.kernel_helpers import KernelSession

FLOOD = 200_000
BOUND = 2000  # lines per rank the cell may hold: the head, a tail, a few notes (not 200,000, not ~2,100)


def _floods_then_says_final():
    for i in range(FLOOD):
        print("line", i)
    print("FINAL LINE")
    return "done"


def _lines_of(text: str, rank: int) -> list[str]:
    label = re.compile(rf"^\[(rank {rank}|ranks [0-9,\-]*)\] ")
    return [line for line in text.splitlines() if label.match(line) and _has_rank(line, rank)]


def _has_rank(line: str, rank: int) -> bool:
    inside = line[1 : line.index("]")].split(" ", 1)[1]
    ranks: set[int] = set()
    for part in inside.split(","):
        lo, _, hi = part.partition("-")
        ranks.update(range(int(lo), int(hi or lo) + 1))
    return rank in ranks


def test_a_flood_shows_a_bounded_head_the_final_lines_and_a_log_that_exists():
    out, err = io.StringIO(), io.StringIO()
    rep = TextReporter(stream=out, err_stream=err)
    assert debug_launcher(_floods_then_says_final, reporter=rep) == ["done", "done"]
    text = out.getvalue() + err.getvalue()
    for rank in (0, 1):
        lines = _lines_of(text, rank)
        assert len(lines) < BOUND, len(lines)
        shown = [line.split("] ", 1)[1] for line in lines]
        assert shown[:3] == ["line 0", "line 1", "line 2"]  # the head, in order
        assert "FINAL LINE" in shown and "line 199999" in shown  # the flood's last lines
        assert shown.index("line 199999") < shown.index("FINAL LINE")
        notes = [line for line in shown if "not shown so far" in line]
        assert notes and re.search(r"the last [\d,]+ lines? of the flood:$", notes[-1])
    paths = set(re.findall(r"the full log is (\S+rank\d\.log)", text))
    assert len(paths) == 2, text[-2000:]
    for path in paths:  # the launch succeeded, and the note's path still exists, holding every line
        with open(path) as f:
            whole = f.read()
        assert whole.count("\n") == FLOOD + 1 and whole.endswith("line 199999\nFINAL LINE\n")
    log_dir = os.path.dirname(next(iter(paths)))
    # the next launch is where the previous launch's logs go away
    assert debug_launcher(_says_hello, num_processes=1, reporter=ListReporter()) == ["hello"]
    assert not os.path.exists(log_dir)


def _says_hello():
    print("hello")
    return "hello"


def test_the_dropped_count_is_what_was_never_sent_and_a_quiet_launch_keeps_no_logs():
    rep = ListReporter()
    assert debug_launcher(_floods_then_says_final, num_processes=1, reporter=rep) == ["done"]
    sent = rep.output(rank=0).splitlines()
    dropped = rep.of_type(Dropped)
    assert dropped[-1].count + len(sent) == FLOOD + 1  # every line was either sent or counted
    # a flood's tail (the rank may pause mid-flood on a busy machine)
    assert 1 <= dropped[-1].held <= TAIL_LINES
    assert sent[-TAIL_LINES:] == [
        *(f"line {i}" for i in range(FLOOD - TAIL_LINES + 1, FLOOD)),
        "FINAL LINE",
    ]
    assert sent[:HEAD_LINES] == [f"line {i}" for i in range(HEAD_LINES)]
    assert os.path.isdir(rep.started[1]["log_dir"])  # kept: a note points there
    quiet = ListReporter()
    assert debug_launcher(_says_hello, num_processes=1, reporter=quiet) == ["hello"]
    assert not os.path.exists(rep.started[1]["log_dir"])  # the next launch removed it
    assert not os.path.exists(quiet.started[1]["log_dir"])  # nothing dropped: nothing kept


FLOOD_CELL = """
from accel_nb import notebook_launcher

def flood():
    for i in range(200_000):
        print("line", i)
    print("FINAL LINE")

notebook_launcher(flood, num_processes=2, cpu=True)
"""


def test_a_flood_in_a_real_kernel_leaves_a_bounded_cell_with_the_final_line_and_an_existing_log():
    with KernelSession() as k:
        cell = k.run(FLOOD_CELL, timeout=300)
        assert cell.error is None, cell.traceback
        text = cell.stdout + cell.stderr
        for rank in (0, 1):
            lines = _lines_of(text, rank)
            assert len(lines) < BOUND, len(lines)
            assert any(line.endswith("] FINAL LINE") for line in lines)
            assert any(line.endswith("] line 0") for line in lines)
        paths = set(re.findall(r"the full log is (\S+rank\d\.log)", text))
        assert len(paths) == 2
        exists = k.run(f"import os\nprint(all(os.path.exists(p) for p in {sorted(paths)!r}))")
        assert exists.stdout.strip() == "True"
        k.kc.stop_channels()
        k.km.shutdown_kernel(now=False)  # as a restart from the notebook: the kernel is asked to end
        k.kc = k.km = None
    assert not any(os.path.exists(p) for p in paths)  # the kernel ended: its kept logs went with it
