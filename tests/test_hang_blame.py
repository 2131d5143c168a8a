"""A hang report names the ranks that wait in a collective and the one that does not (the likely cause).

The classification reads the stacks the hang watchdog collects (faulthandler's text), so the real
test launches two processes: rank 0 waits in ``all_reduce`` while rank 1 sleeps.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from accel_nb import LaunchError, PartialState, debug_launcher
from accel_nb.launch.parent.hang_blame import blame_stacks, collective_of, user_line
from accel_nb.launch.parent.reporting import ListReporter

TORCH = "/venv/lib/python3.11/site-packages/torch"
IN_ALL_REDUCE = f"""Current thread 0x00007f (most recent call first):
  File "{TORCH}/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{TORCH}/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/ipykernel_81/2291.py", line 4 in train
"""
IN_SLEEP = """Current thread 0x00007f (most recent call first):
  File "/tmp/ipykernel_81/2291.py", line 3 in train
"""
IN_BACKWARD = f"""Thread 0x00007e (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f (most recent call first):
  File "{TORCH}/autograd/graph.py", line 829 in _engine_run_backward
  File "{TORCH}/autograd/__init__.py", line 353 in backward
  File "{TORCH}/_tensor.py", line 626 in backward
  File "/tmp/ipykernel_81/77.py", line 9 in train
"""


def test_stacks_are_sorted_into_waiting_in_a_collective_and_elsewhere():
    assert collective_of(IN_ALL_REDUCE) == "all_reduce"  # the call, not the logging decorator around it
    assert collective_of(IN_SLEEP) is None
    assert collective_of(IN_BACKWARD) == "backward (DDP's gradient all-reduce)"
    assert user_line(IN_ALL_REDUCE) == "train, line 4 of /tmp/ipykernel_81/2291.py"
    blame = blame_stacks({0: IN_ALL_REDUCE, 1: IN_SLEEP, 2: IN_BACKWARD}, [0, 1, 2, 3])
    assert blame.waiting == {0: "all_reduce", 2: "backward (DDP's gradient all-reduce)"}
    assert blame.elsewhere == {1: "train, line 3 of /tmp/ipykernel_81/2291.py"} and blame.silent == [3]
    assert blame.likely_cause == [1, 3]
    everyone_waits = blame_stacks({0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE})
    assert everyone_waits.likely_cause == [] and "every rank waits in it" in everyone_waits.sentence()
    nobody_waits = blame_stacks({0: IN_SLEEP, 1: IN_SLEEP})
    assert nobody_waits.likely_cause == [] and nobody_waits.sentence().startswith(
        "no rank is in a collective"
    )


def _rank_1_sleeps_while_rank_0_waits_in_all_reduce(flag: str):
    import torch
    import torch.distributed as dist

    state = PartialState()
    if state.process_index == 1:
        while not os.path.exists(flag):  # progress (output) until rank 0 is about to enter the collective
            print("rank 1 still working", flush=True)
            time.sleep(0.2)
        time.sleep(600)  # the cause: no collective, no output
    open(flag, "w").close()
    dist.all_reduce(torch.ones(1))


@pytest.mark.timeout(300)
def test_a_hang_blames_the_rank_that_is_not_in_the_collective(tmp_path):
    import torch.distributed  # noqa: F401 - imported before the fork: the ranks do not import it under the watchdog

    rep = ListReporter()
    with pytest.raises(LaunchError) as info:
        debug_launcher(
            _rank_1_sleeps_while_rank_0_waits_in_all_reduce,
            args=(str(tmp_path / "entering"),),
            reporter=rep,
            timeout=3,
        )
    err = info.value
    text = str(err)
    assert "the launch hung" in text
    assert (
        "rank 0 waits in a collective (all_reduce); rank 1 is not: the likely cause, it is waited for (at "
        in text
    )
    assert "_rank_1_sleeps_while_rank_0_waits_in_all_reduce, line " in text
    first, second = err.failures
    assert first.rank == 1 and first.first and "the likely cause" in first.summary()
    assert "not in a collective while rank 0 waited in one" in first.summary()
    assert second.rank == 0
    assert re.fullmatch(
        r"rank 0 hung: waited in a collective \(all_reduce\) for \d+ s; it was stopped", second.summary()
    )
    ok, summary = rep.finished
    assert not ok and summary == first.summary()  # what the widget's last line says names rank 1


SESSION_CELL = """
import os, time, torch, torch.distributed as dist
if dist.get_rank() == 1:
    while not os.path.exists(FLAG):
        print("rank 1 still working", flush=True)
        time.sleep(0.2)
    time.sleep(600)
open(FLAG, "w").close()
dist.all_reduce(torch.ones(1))
"""


@pytest.mark.timeout(300)
def test_a_session_cell_hang_blames_the_rank_that_is_not_in_the_collective(tmp_path):
    from accel_nb import Session

    with Session(num_processes=2, cpu=True, progress="text") as session:
        session.run(f"FLAG = {str(tmp_path / 'entering')!r}")
        with pytest.raises(LaunchError) as info:
            session.run_cell(SESSION_CELL, "<accelerate-cell-7>", timeout=3.0)  # %%accelerate --timeout 3
    text = str(info.value)
    assert "hung: no rank made progress for" in text
    assert "rank 0 waits in a collective (all_reduce); rank 1 is not: the likely cause" in text, text
    assert "(at <module>, line 7 of <accelerate-cell-7>)" in text, text


WIDGET_CELL = """
import os, time, torch, torch.distributed
from accel_nb import notebook_launcher, PartialState

def train(flag):
    if PartialState().process_index == 1:
        while not os.path.exists(flag):
            print("working", flush=True)
            time.sleep(0.2)
        time.sleep(600)
    open(flag, "w").close()
    torch.distributed.all_reduce(torch.ones(1))

notebook_launcher(train, args=(FLAG,), num_processes=2, cpu=True, timeout=3)
"""


@pytest.mark.timeout(300)
def test_the_live_widget_names_the_rank_that_caused_the_hang_in_a_real_kernel(tmp_path):
    import json

    from tests.kernel_helpers import KernelSession

    with KernelSession() as k:  # the live widget: the default display in a kernel
        out = k.run(f"FLAG = {str(tmp_path / 'entering')!r}\n" + WIDGET_CELL, timeout=240)
    assert out.error is not None and out.error["ename"] == "LaunchError", out.text
    assert "rank 1 is not: the likely cause" in out.error["evalue"]
    widget_state = json.dumps(out.comms)  # what the widget shows (its models' state), as sent to the browser
    # the culprit's own row says so (the waiting rank's row: stopped)
    assert widget_state.count("hung (likely cause)") >= 1, widget_state[-3000:]
    said = re.findall(r"rank \d hung: [^\"<]*", widget_state)
    assert said and said[-1].startswith("rank 1 hung: no progress for "), said
    assert (
        "not in a collective while rank 0 waited in one: the likely cause at train, line 11 of " in said[-1]
    )  # the sleep
