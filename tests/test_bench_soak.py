"""The soak benchmark's helpers: its schedule of cells, its process samples and its growth check.

The soak itself (500 cells in a real kernel) is run with ``python -m benchmarks run soak``, not here.
"""

from __future__ import annotations

import subprocess
import sys

from benchmarks.bench_soak import growth_after, process_sample, sample_table, schedule, take_sample


def test_the_schedule_has_the_cells_the_issue_asks_for():
    kinds = schedule(500, 50, 10, 20)
    assert len(kinds) == 500
    assert kinds.count("interrupt_collective") == 10
    assert kinds.count("interrupt") == 40
    assert sum(k.startswith("fail") for k in kinds) == 20
    assert {"train", "collective", "print", "tqdm", "push", "pull"} <= set(kinds)
    # spread over the run: no two interrupts or failures in a row, the first 50 cells hold some
    special = [i for i, k in enumerate(kinds) if k.startswith(("interrupt", "fail"))]
    assert all(b - a > 1 for a, b in zip(special, special[1:]))
    assert any(i < 50 for i in special) and any(i > 450 for i in special)
    assert schedule(100, 10, 2, 4).count("interrupt_collective") == 2


def test_a_process_sample_counts_its_fds_threads_and_live_children():
    code = (
        "import subprocess, sys, threading, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], stdin=subprocess.PIPE) "
        "for _ in range(2)]\n"
        "threading.Thread(target=sys.stdin.read, daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "ready"
        sample = process_sample(parent.pid)
        assert sample["children"] == 2
        assert sample["threads"] >= 2
        assert sample["fds"] >= 5  # stdio and the two children's stdin pipes
        assert sample["rss_mib"] > 1
        both = take_sample(50, parent.pid, {0: parent.pid})
        assert both["cells"] == 50 and both["rank 0"]["children"] == 2
    finally:
        parent.kill()
        parent.wait()


def test_growth_is_measured_from_the_sample_after_the_first_cells_and_the_table_has_a_row_each():
    def sample(cells, fds, threads, rss):
        proc = {"fds": fds, "threads": threads, "children": 0, "rss_mib": rss}
        return {"cells": cells, "kernel": dict(proc), "rank 0": dict(proc, fds=fds + 10)}

    samples = [
        sample(0, 60, 8, 300.0),
        sample(50, 70, 9, 310.0),
        sample(100, 70, 9, 311.5),
        sample(150, 72, 9, 311.0),
    ]
    grew = growth_after(samples, 50)
    assert grew["kernel"] == {"fds": 2, "threads": 0, "children": 0, "rss_mib": 1.5}
    assert grew["rank 0"]["fds"] == 2  # the rise before cell 50 (60 -> 70) is warm-up, not growth
    table = sample_table(samples)
    assert table.splitlines()[0].startswith("| cells | fds (kernel) | fds (rank 0) | threads (kernel)")
    assert "| 150 | 72 | 82 | 9 | 9 | 0 | 0 | 311.0 | 311.0 |" in table
    assert table.splitlines()[0].endswith("| kernel RSS (MiB) | RSS rank 0 (MiB) |")
    assert len(table.splitlines()) == 2 + len(samples)
