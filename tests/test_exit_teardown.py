"""A finished distributed script exits with status 0: gloo's threads are joined before the interpreter finalises.

Gloo's worker threads free each finished collective after the caller's ``wait()`` returned; freeing a
tensor Python knows takes the GIL, and a thread that takes the GIL while the interpreter finalises is
ended by ``pthread_exit``, which C++ turns into "terminate called without an active exception"
(SIGABRT) after the script's last line. accel_nb's exit handler destroys the group and releases what
keeps it alive (a DDP model's reducer, torch functions whose default argument is the group), so the
group's destructor joins those threads first.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")

# the timeout is a safety net: the training test launches 3 jobs, minutes on a loaded machine
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(900)]


def _launch(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        ACCEL_NB_CONFIG_FILE=os.path.join(cwd, "default_config.yaml"),
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT,
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "accel_nb.commands", "launch", "--num_processes", "2", "--cpu", *args]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("destroy", [False, True], ids=["left-formed", "destroyed-by-script"])
def test_ranks_exit_with_status_zero_while_gloo_frees_work_held_by_a_ddp_group(tmp_path, destroy):
    # without the release of the reducer's hold this aborted a rank in 3 runs of 3 (either flag)
    out = _launch(
        os.path.join(SCRIPTS, "pending_work_exit.py"), *(["--destroy"] if destroy else []), cwd=str(tmp_path)
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "terminate called" not in text
    assert "rank 0: returned" in text and "rank 1: returned" in text


def test_a_training_script_that_just_returns_is_never_reported_failed(tmp_path):
    """DDP, accumulation, clipping and a reduce each step, no teardown in the script: status 0 every run."""
    for run in range(3):
        losses = tmp_path / f"losses{run}.json"
        out = _launch(os.path.join(SCRIPTS, "ddp_train_exit.py"), str(losses), cwd=str(tmp_path))
        assert out.returncode == 0, f"run {run}:\n{out.stdout}\n{out.stderr}"
        assert "terminate called" not in out.stderr
        values = json.loads(losses.read_text())
        assert len(values) == 2 * (64 // 2 // 4)  # 2 epochs of rank 0's 8 batches
        assert all(math.isfinite(v) for v in values)


RELEASE = r"""
import json, os, sys
import torch, torch.distributed as dist
from accel_nb.process_group import release_process_groups

def threads():
    return len(os.listdir("/proc/self/task"))

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)  # a group nothing else holds: what destroying leaves
formed = threads()
dist.destroy_process_group()
plain = threads()
dist.init_process_group("gloo", rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
model(torch.ones(2, 4)).sum().backward()
import torch.distributed.nn.functional as fn  # its functions' defaults hold the group formed above
held = [type(d).__name__ for d in fn.broadcast.__defaults__]
print(json.dumps({"formed": formed, "plain": plain, "released": release_process_groups(), "after": threads(),
                  "held": held, "left": [type(d).__name__ for d in fn.broadcast.__defaults__],
                  "initialized": dist.is_initialized(), "reducer": hasattr(model, "reducer")}))
"""


def test_release_process_groups_joins_gloo_threads_a_ddp_model_kept(tmp_path):
    from accel_nb.launch.ports import pick_free_port

    port = pick_free_port("127.0.0.1")
    out = subprocess.run(
        [sys.executable, "-c", RELEASE, str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["formed"] > seen["plain"]  # destroying a group nothing holds joins gloo's threads
    assert seen["held"] == ["ProcessGroup"]
    assert seen["released"] == 1 and not seen["reducer"] and not seen["initialized"]
    assert seen["left"] == ["NoneType"]
    assert seen["after"] == seen["plain"]  # the DDP-held group's destructor ran and joined its threads too


_FAILING_LAUNCH = """
import sys
from accel_nb import LaunchError, notebook_launcher


def boom():
    raise ValueError("boom in the rank")


try:
    notebook_launcher(boom, num_processes=2)
except LaunchError as err:
    print("LAUNCH ERROR", type(err).__name__, "boom in the rank" in str(err), flush=True)
import torch.distributed.elastic.multiprocessing.errors  # the script goes on importing torch
print("IMPORTED", flush=True)
sys.exit(3)
"""


def test_a_failing_launch_from_a_fresh_script_raises_launch_error_every_time(tmp_path):
    """A script that has not imported torch.distributed: the failure path imports it (torch's elastic
    errors); a background import of torch beside it made torch's start-up abort the script (SIGABRT)."""
    script = tmp_path / "failing_launch.py"
    script.write_text(_FAILING_LAUNCH)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for run in range(3):  # 3 runs of 3 aborted before
        out = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )
        text = f"run {run}:\n{out.stdout}\n{out.stderr}"
        assert out.returncode == 3, text
        assert "terminate called" not in out.stderr, text
        assert out.stdout.splitlines()[-2:] == ["LAUNCH ERROR LaunchError True", "IMPORTED"], text
