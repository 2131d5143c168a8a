"""Import cost: `import accel_nb` (and its first public name) on top of `import torch`, vs the reference.

python -m benchmarks.bench_import [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys

CODE = (
    "import time; t=time.perf_counter(); import torch; t1=time.perf_counter(); {extra}; "
    "t2=time.perf_counter(); print(t1-t, t2-t1)"
)
OURS = "import accel_nb; accel_nb.PartialState"
REFERENCE = "import accelerate; accelerate.Accelerator"
HEAVY = ("IPython", "ipywidgets", "torch_xla", "transformers")


def measure(extra: str, repeat: int) -> list[tuple[float, float]]:
    """(seconds for import torch, seconds for ``extra`` after it) in ``repeat`` fresh interpreters."""
    out = []
    for _ in range(repeat):
        res = subprocess.run(
            [sys.executable, "-c", CODE.format(extra=extra)], capture_output=True, text=True, check=True
        )
        a, b = map(float, res.stdout.split())
        out.append((a, b))
    return out


def heavy_modules(extra: str) -> list[str]:
    """Optional heavy modules that ``extra`` pulls in."""
    code = f"import sys; {extra}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return res.stdout.split()


def run(quick: bool = False) -> list[dict]:
    repeat = 3 if quick else 7
    ours = measure(OURS, repeat)
    try:
        ref: list[tuple[float, float]] | None = measure(REFERENCE, repeat)
    except subprocess.CalledProcessError:
        ref = None  # the reference library is not installed (it is the optional `bench` extra)
    heavy = heavy_modules(OURS)
    note = f"median of {repeat} fresh interpreters; heavy modules pulled in: {', '.join(heavy) or 'none'}"
    rows = []
    for label, pick in (("median", statistics.median), ("min", min)):
        ours_s = pick(b for _, b in ours)
        ref_s = pick(b for _, b in ref) if ref else None
        rows.append(
            {
                "benchmark": "import",
                "metric": f"import cost on top of torch ({label})",
                "accel_nb": ours_s,
                "reference": ref_s,
                "ratio": ours_s / ref_s if ref_s else None,
                "unit": "s",
                "note": note if label == "median" else "reference: import accelerate; accelerate.Accelerator",
            }
        )
    torch_s = statistics.median(a for a, _ in ours)
    ours_total = (torch_s + statistics.median(b for _, b in ours)) / torch_s
    ref_total = (torch_s + statistics.median(b for _, b in ref)) / torch_s if ref else None
    rows.append(
        {
            "benchmark": "import",
            "metric": "(torch + package) / torch import time",
            "accel_nb": ours_total,
            "reference": ref_total,
            "ratio": ours_total / ref_total if ref_total else None,
            "unit": "x",
            "note": f"import torch alone: {torch_s:.2f} s (median)",
        }
    )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
