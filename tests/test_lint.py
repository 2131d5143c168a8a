"""The tree stays lint-clean (ruff, configured in pyproject.toml)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_is_clean():
    pytest.importorskip("ruff")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "accel_nb",
            "tests",
            "benchmarks",
            "examples",
            "notebooks/_build_notebooks.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
