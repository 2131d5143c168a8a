"""Import cost: `import accel_nb` over `import torch`, in fresh interpreters.

    python benchmarks/bench_import.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = "import time, sys; t=time.perf_counter(); import torch; t1=time.perf_counter(); {extra}; t2=time.perf_counter(); print(t1-t, t2-t1)"


def measure(extra: str, repeat: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(repeat):
        res = subprocess.run([sys.executable, "-c", CODE.format(extra=extra)], capture_output=True, text=True, check=True)
        a, b = map(float, res.stdout.split())
        out.append((a, b))
    return out


def run(repeat: int = 7) -> dict[str, float]:
    ours = measure("import accel_nb; accel_nb.PartialState", repeat)
    heavy = subprocess.run(
        [sys.executable, "-c", "import sys, accel_nb; accel_nb.PartialState; print(' '.join(m for m in ('IPython','ipywidgets','torch_xla') if m in sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    rows: dict[str, float] = {}
    torch_s = statistics.median(a for a, _ in ours)
    extra_s = statistics.median(b for _, b in ours)
    rows["import torch (s, median)"] = torch_s
    rows["accel_nb on top (s, median)"] = extra_s
    rows["ratio (torch+accel_nb)/torch"] = (torch_s + extra_s) / torch_s
    try:
        ref = measure("import accelerate; accelerate.Accelerator", repeat)
        rows["reference on top (s, median)"] = statistics.median(b for _, b in ref)
    except subprocess.CalledProcessError:
        pass
    print(f"heavy modules pulled in by import accel_nb: {heavy or 'none'}")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    for k, v in run(ap.parse_args().repeat).items():
        print(f"{k:40s} {v:.3f}")
