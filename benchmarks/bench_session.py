"""Interactive sessions from a REAL Jupyter kernel: an empty ``%%accelerate`` cell and a one-DDP-step cell
on a warm 2-worker session, against the same cell launched one-shot, and against the reference
library's ``notebook_launcher`` running the same work (it has no warm workers: every cell is a launch).

The warm DDP step cell uses a model prepared once in an earlier cell (that is what a session is
for); the one-shot cells build and prepare it inside the launch, as a user without a session must.

python -m benchmarks.bench_session [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.bench_launch import _cell  # noqa: E402 - after the path is set

SETUP = """
import json, time, contextlib, io
ip = get_ipython()
ip.run_line_magic("load_ext", "accel_nb")

STEP_SETUP = '''
import torch
from accel_nb import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
'''
STEP = '''
loss = model(torch.ones(4, 8)).sum()
accelerator.backward(loss)
opt.step(); opt.zero_grad()
'''

def time_cell(line, body, n):
    times = []
    for _ in range(n):
        with contextlib.redirect_stdout(io.StringIO()):
            t = time.perf_counter()
            ip.run_cell_magic("accelerate", line, body)
            times.append(time.perf_counter() - t)
    return times

def ref_empty():
    return None

def ref_step():
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    loss = model(torch.ones(4, 8)).sum()
    accelerator.backward(loss)
    opt.step()

def time_reference(fn, n, port):
    from accelerate import notebook_launcher as ref_launcher
    times = []
    for i in range(n):
        with contextlib.redirect_stdout(io.StringIO()):
            t = time.perf_counter()
            ref_launcher(fn, num_processes=2, use_port=str(port + i))
            times.append(time.perf_counter() - t)
    return times
"""


def _json(k, code: str, timeout: float = 900) -> list[float]:
    return json.loads(_cell(k, f"print(json.dumps({code}))", timeout=timeout).strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    from tests.kernel_helpers import KernelSession

    warm_n, oneshot_n, ref_n = (20, 3, 2) if quick else (50, 5, 3)
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        _cell(k, SETUP)
        _cell(k, "time_cell('-n 2 --cpu', 'pass', 1)")  # warm-up: imports, first fork
        oneshot_empty = _json(k, f"time_cell('-n 2 --cpu', 'pass', {oneshot_n})")
        oneshot_step = _json(k, f"time_cell('-n 2 --cpu', STEP_SETUP + STEP, {oneshot_n})")
        _cell(k, "ip.run_line_magic('accelerate', 'start -n 2 --cpu')", timeout=300)
        _cell(k, "time_cell('', STEP_SETUP, 1); time_cell('', STEP, 2)")  # the model, once; DDP's first steps
        warm_empty = _json(k, f"time_cell('', 'pass', {warm_n})")
        warm_step = _json(k, f"time_cell('', STEP, {warm_n})")
        _cell(k, "ip.run_line_magic('accelerate', 'stop')")
        ref_empty = ref_step = None
        try:
            import accelerate  # noqa: F401

            ref_empty = _json(k, f"time_reference(ref_empty, {ref_n}, 29810)")
            ref_step = _json(k, f"time_reference(ref_step, {ref_n}, 29830)")
        except ImportError:
            pass
    rows = []
    for what, warm, oneshot, ref, goal in (
        ("empty cell (pass)", warm_empty, oneshot_empty, ref_empty, "goal warm <= 50 ms"),
        ("cell running one DDP training step", warm_step, oneshot_step, ref_step, ""),
    ):
        for label, pick in (("median", statistics.median), ("min", min)):
            ref_ms = pick(ref) * 1000 if ref else None
            for mode, times in (("warm 2-worker session", warm), ("one-shot launch (fork)", oneshot)):
                ours_ms = pick(times) * 1000
                rows.append(
                    {
                        "benchmark": "session",
                        "metric": f"%%accelerate {what}, {mode} ({label})",
                        "accel_nb": ours_ms,
                        "reference": ref_ms,
                        "ratio": ours_ms / ref_ms if ref_ms else None,
                        "unit": "ms",
                        "note": "; ".join(
                            x
                            for x in (
                                goal if mode.startswith("warm") else "",
                                f"{len(times)} cells, 2 CPU ranks (gloo), text display, timed in the kernel",
                                "reference: its notebook_launcher doing the same work (one-shot; it has no session)",
                            )
                            if x
                        ),
                    }
                )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
