"""XLA's CPU-backend rendezvous abort, reproduced with torch_xla alone (no accel_nb): evidence for docs/tpu.md.

    PJRT_DEVICE=CPU .venv-xla/bin/python scripts/xla_rendezvous_repro.py             # 5 runs of each mode
    PJRT_DEVICE=CPU .venv-xla/bin/python scripts/xla_rendezvous_repro.py --runs 10 --steps 50

Each run is a fresh process: ``torch_xla.launch`` on two CPU devices (``CPU_NUM_DEVICES=2``, the
devices are two threads of one process), and every device does ``STEPS`` times: a host tensor sent
to the device (and waited for), ``xm.all_reduce(REDUCE_SUM, x)``, ``torch_xla.sync()``, the result read back and
checked. Two modes:

- ``plain``: exactly that, as torch_xla's documentation writes a loop.
- ``locked``: the same, with ``torch_xla.sync()`` under one lock of the process, so that the two
  device threads compile the step's graph one after the other (the second finds it in torch_xla's
  compilation cache).

What it shows (torch 2.9.0 + torch-xla 2.9.0): ``plain`` aborts in its first step with
"Termination timeout for `all reduce RendezvousKey{..., op_id=0}`" while the other thread waits
for ``op_id=1``: both device threads compiled the graph, each compilation is its own HLO module,
and XLA's CPU runtime keys the rendezvous of an all-reduce without a channel id by the module's
unique id, so the two threads wait in two different rendezvous until XLA aborts the process
after 10 s. ``locked`` passes every run, although its graphs are tiny and their inputs ready
(so the lock alone, held while the collective launches, does not make XLA wait in it). The script prints one line per run and a summary; its
exit status is 0 when the numbers match that (every ``plain`` run aborted, no ``locked`` run did).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading

_LOCK = threading.Lock()


def _device_loop(index: int, steps: int, locked: bool) -> None:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()
    for step in range(steps):
        x = torch.full((4,), float((index + 2) * (step + 2))).to(device)
        x.cpu()  # the input is on the device and ready: XLA may run the small graph inline
        total = xm.all_reduce(xm.REDUCE_SUM, x)
        if locked:
            with _LOCK:
                torch_xla.sync()
        else:
            torch_xla.sync()
        got = total.cpu()[0].item()
        assert got == 5.0 * (step + 2), f"device {index} step {step}: {got}"
    print(f"device {index}: {steps} all-reduces ok", flush=True)


def _child(steps: int, locked: bool) -> None:
    import torch_xla

    torch_xla.launch(_device_loop, args=(steps, locked), start_method="fork")


def _one_run(mode: str, steps: int) -> tuple[bool, list[str]]:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--steps", str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    aborted = "Termination timeout" in out
    if proc.returncode != 0 and not aborted:
        raise RuntimeError(f"{mode} run failed otherwise (exit {proc.returncode}):\n{out[-3000:]}")
    return aborted, sorted(set(re.findall(r"op_id=\d+", out)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per mode (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="all-reduces per device per run (default 20)")
    parser.add_argument("--modes", default="plain,locked", help="comma-separated: plain, locked")
    parser.add_argument("--child", choices=("plain", "locked"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.steps, args.child == "locked")
        return 0
    aborts: dict[str, int] = {}
    for mode in args.modes.split(","):
        aborts[mode] = 0
        for run in range(1, args.runs + 1):
            aborted, op_ids = _one_run(mode, args.steps)
            aborts[mode] += aborted
            what = f"ABORTED (threads waited in {', '.join(op_ids)})" if aborted else "passed"
            print(f"{mode} run {run}/{args.runs}: {what}", flush=True)
    for mode, n in aborts.items():
        print(f"{mode}: {n} of {args.runs} runs aborted in XLA's rendezvous")
    expected = aborts.get("plain", args.runs) == args.runs and aborts.get("locked", 0) == 0
    return 0 if expected else 1


if __name__ == "__main__":
    sys.exit(main())
