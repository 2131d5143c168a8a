"""Experiment tracking cost on the main process: ``accelerator.log`` to TensorBoard, accel_nb vs accelerate.

Each library runs in its own fresh interpreter (one process, CPU): ``Accelerator(log_with=
"tensorboard", project_dir=tmp)``, ``init_trackers`` with a small config, then N calls of
``accelerator.log({"loss": tensor, "acc": float}, step=i)`` timed one by one, then
``end_training``. Reported: the median and 90th percentile cost of one ``log`` call, and the
time of init_trackers + end_training. Outside a launch accel_nb's ``log`` also tries to send the
values to a launcher (a no-op here), so the figure includes that check.

    python -m benchmarks.bench_tracking [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, sys, time, warnings
import torch
lib, project_dir, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
if lib == "accel_nb":
    from accel_nb import Accelerator
else:
    from accelerate import Accelerator
warnings.simplefilter("ignore")
acc = Accelerator(cpu=True, log_with="tensorboard", project_dir=project_dir)
t0 = time.perf_counter()
acc.init_trackers("bench", config={"lr": 0.1, "batch_size": 32, "model": "mlp"})
init_s = time.perf_counter() - t0
loss = torch.tensor(0.5)
per_call = []
for i in range(calls):
    t = time.perf_counter()
    acc.log({"loss": loss, "acc": 0.9}, step=i)
    per_call.append(time.perf_counter() - t)
t0 = time.perf_counter()
acc.end_training()
end_s = time.perf_counter() - t0
print(json.dumps({"per_call": per_call, "init_end_s": init_s + end_s}))
"""


def measure(lib: str, calls: int) -> dict:
    with tempfile.TemporaryDirectory() as project_dir:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
        done = subprocess.run(
            [sys.executable, "-c", WORKER, lib, project_dir, str(calls)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=300,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def run(quick: bool = False) -> list[dict]:
    calls = 300 if quick else 3000
    ours = measure("accel_nb", calls)
    try:
        ref: dict | None = measure("accelerate", calls)
    except subprocess.CalledProcessError:
        ref = None  # the reference library is not installed (the optional `bench` extra)
    rows = []
    for metric, pick in (
        ("log() to TensorBoard, median per call", statistics.median),
        ("log() to TensorBoard, p90 per call", _p90),
    ):
        ours_us = pick(ours["per_call"]) * 1e6
        ref_us = pick(ref["per_call"]) * 1e6 if ref else None
        rows.append(
            {
                "benchmark": "tracking",
                "metric": metric,
                "accel_nb": ours_us,
                "reference": ref_us,
                "ratio": ours_us / ref_us if ref_us else None,
                "unit": "us",
                "note": f"{calls} calls of {{'loss': tensor, 'acc': float}}, one process, fresh interpreter each",
            }
        )
    rows.append(
        {
            "benchmark": "tracking",
            "metric": "init_trackers + end_training",
            "accel_nb": ours["init_end_s"],
            "reference": ref["init_end_s"] if ref else None,
            "ratio": ours["init_end_s"] / ref["init_end_s"] if ref else None,
            "unit": "s",
            "note": "TensorBoard run with a 3-key config",
        }
    )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        ref = "-" if row["reference"] is None else f"{row['reference']:.4g}"
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        print(
            f"{row['metric']:<42} accel_nb {row['accel_nb']:.4g} {row['unit']}  reference {ref}  ratio {ratio}"
        )
