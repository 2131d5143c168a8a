"""scripts/gpu_check.sh without a GPU, and the GPU section it writes into docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_a_gpu_it_says_so_and_runs_nothing():
    doc = os.path.join(ROOT, "docs", "benchmarks.md")
    before = open(doc, encoding="utf-8").read()
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA GPU on this machine" in proc.stdout and "nothing was run" in proc.stdout
    assert "pytest" not in proc.stdout and open(doc, encoding="utf-8").read() == before


def test_gpu_section_is_written_once_and_replaced_on_the_next_run(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nCPU table\n\n## What each benchmark measures\n\n- x\n")
    out = tmp_path / "out"
    out.mkdir()
    row = {
        "benchmark": "big_model",
        "metric": "GPU load ratio",
        "accel_nb": 1.1,
        "reference": 3.0,
        "ratio": 0.37,
        "unit": "x",
        "note": "n",
    }
    (out / "bench.json").write_text(json.dumps([row]))
    (out / "kernel.json").write_text(
        json.dumps(
            {
                "accel_nb": {"times": [1.5, 0.4], "result": {"device": "cuda:0"}, "cuda_in_kernel": False},
                "reference": {"error": "accelerate is not installed"},
            }
        )
    )
    (out / "pytest.txt").write_text("....\n4 passed in 3.2s\n")
    script = os.path.join(ROOT, "scripts", "gpu_check_report.py")
    for _ in range(2):
        subprocess.run([sys.executable, script, "write", str(doc), str(out), "0"], check=True, timeout=120)
    text = doc.read_text()
    assert text.count("## GPU run") == 1 and text.count("<!-- gpu-run:begin -->") == 1
    assert text.index("CPU table") < text.index("## GPU run") < text.index("## What each benchmark measures")
    assert "4 passed in 3.2s (exit code 0)" in text and "| big_model | GPU load ratio |" in text
    assert "second launch" in text and "rank ran on cuda:0" in text and "- **Date**: " in text
