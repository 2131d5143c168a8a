"""The benchmarks runner: discovery, one subprocess per module, failures as rows, min/median, the page."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GOOD = '''"""A fake benchmark that returns fixed rows."""
import os
def run(quick=False):
    n = float(os.environ.get("FAKE_BENCH_N", "2"))
    return [{"benchmark": "fake", "metric": "t", "accel_nb": n, "reference": 4.0, "ratio": None,
             "unit": "s", "note": "quick" if quick else "full"}]
'''
CRASH = '''"""A fake benchmark whose process dies."""
import os
def run(quick=False):
    print("about to die", flush=True)
    os._exit(3)
'''
RAISE = '''"""A fake benchmark that raises."""
def run(quick=False):
    raise ValueError("bad bench input")
'''


@pytest.fixture()
def fake_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fakebench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bench_good.py").write_text(GOOD)
    (pkg / "bench_crash.py").write_text(CRASH)
    (pkg / "bench_raise.py").write_text(RAISE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return pkg


def test_discovers_the_real_modules():
    names = runner.discover()
    assert "import" in names
    assert all(os.path.exists(os.path.join(ROOT, "benchmarks", f"bench_{n}.py")) for n in names)


def test_rows_come_back_with_the_ratio_filled_in(fake_package):
    assert runner.discover(str(fake_package)) == ["crash", "good", "raise"]
    rows, wall = runner.run_module("good", quick=True, package="fakebench")
    assert wall > 0
    assert len(rows) == 1
    row = rows[0]
    assert row["accel_nb"] == 2.0 and row["reference"] == 4.0 and row["ratio"] == 0.5
    assert row["note"] == "quick"


def test_a_failing_module_becomes_a_row_and_the_rest_still_run(fake_package):
    rows, walls = runner.run_all(["crash", "raise", "good"], package="fakebench", echo=False)
    by_name = {r["benchmark"]: r for r in rows}
    assert by_name["crash"]["metric"] == "FAILED" and "exit code 3" in by_name["crash"]["note"]
    assert (
        by_name["raise"]["metric"] == "FAILED" and "ValueError: bad bench input" in by_name["raise"]["note"]
    )
    assert by_name["fake"]["ratio"] == 0.5
    assert set(walls) == {"crash", "raise", "good"}
    text = runner.table(rows)
    assert "FAILED" in text and "0.5" in text


def test_repeats_report_min_and_median():
    reps = [
        [runner.normalize_row({"benchmark": "b", "metric": "m", "accel_nb": v, "reference": 2.0}, "b")]
        for v in (3.0, 1.0, 2.0)
    ]
    (row,) = runner.aggregate(reps)
    assert row["accel_nb"] == 2.0 and row["accel_nb_min"] == 1.0 and row["repeats"] == 3
    assert row["ratio"] == 1.0 and row["ratio_min"] == 0.5
    assert "2 (min 1)" in runner.table([row])


def test_markdown_page_names_date_machine_and_command(fake_package):
    rows, walls = runner.run_all(["good"], package="fakebench", echo=False)
    page = runner.markdown_page(rows, ["run", "good", "--quick"], [], walls)
    assert page.startswith("# Benchmarks")
    assert "python -m benchmarks run good --quick" in page
    assert "**Date**" in page and "**CPU**" in page and "**RAM**" in page and "**GPU**" in page
    assert "| fake | t | 2 | 4 | 0.5 | s | full |" in page


def test_cli_rejects_unknown_names():
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "no_such_bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "unknown benchmark" in res.stderr and "import" in res.stderr


def test_a_partial_run_rewrites_only_its_modules_rows():
    def row(benchmark, metric, value):
        return runner.normalize_row(
            {"benchmark": benchmark, "metric": metric, "accel_nb": value, "reference": 2.0, "unit": "s"}, "x"
        )

    full = [row("alpha_2proc", "step", 1.0), row("beta", "load", 3.0), row("alpha_2proc", "bytes", 5.0)]
    page = runner.markdown_page(
        full, ["run", "--markdown", "p.md"], ["alpha", "beta"], {"alpha": 1, "beta": 2}
    )
    page += "\n<!-- gpu-run:begin -->\n## GPU run\nkept\n<!-- gpu-run:end -->\n"
    assert runner._table_span(page) is not None and runner._table_span("# nothing") is None

    again = runner.updated_page(
        page,
        [row("alpha_2proc", "step", 0.5)],
        ["run", "alpha", "--markdown", "p.md"],
        ["alpha"],
        {"alpha": 7},
    )
    assert "| beta | load | 3 | 2 | 1.5 | s |  |" in again  # the other module's row, as it was
    assert "| alpha_2proc | step | 0.5 | 2 | 0.25 | s |  |" in again
    assert "| alpha_2proc | step | 1 |" not in again and "| alpha_2proc | bytes |" not in again
    assert again.index("alpha_2proc | step") < again.index("| beta |")  # where alpha's rows were
    assert "python -m benchmarks run --markdown p.md" in again  # the full run's command stays
    assert "**Re-run** of alpha:" in again and "`python -m benchmarks run alpha --markdown p.md`" in again
    assert "alpha 7 s" in again and "(same machine" in again
    assert "## GPU run\nkept" in again and "## What each benchmark measures" in again
    # a second re-run of the same module replaces its line and its rows
    third = runner.updated_page(
        again, [row("alpha_2proc", "step", 0.25)], ["run", "alpha"], ["alpha"], {"alpha": 1}
    )
    assert third.count("**Re-run** of alpha:") == 1 and third.count("| alpha_2proc |") == 1
    assert "| alpha_2proc | step | 0.25 |" in third and "| beta | load | 3 |" in third
