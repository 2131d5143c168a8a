"""``accel_nb.Session`` outside IPython: real ranks (gloo on CPU) that keep their namespace across commands."""

from __future__ import annotations

import psutil
import pytest

from accel_nb import LaunchError, Session
from accel_nb.launch.errors import LaunchSetupError
from accel_nb.launch.session.warm_session import SessionError
from accel_nb.notebook.session_view import status_text
from tests.dist_helpers import free_port
from tests.process_helpers import assert_no_descendants

pytestmark = [pytest.mark.multiproc]


NOTEBOOK = {"__name__": "__main__"}  # a function defined in a notebook: module __main__, sent by value
exec("def helper(n):\n    return n * 100 + rank  # rank: a name of the rank's namespace\n", NOTEBOOK)


@pytest.fixture(scope="module")
def session():
    with Session(num_processes=2, cpu=True, progress="text") as s:
        yield s
    assert_no_descendants(psutil.Process(), within=5)


def test_code_function_push_and_pull_share_one_namespace_per_rank(session):
    assert session.run("import torch.distributed as dist\nrank = dist.get_rank()\nrank * 10") == [0, 10]
    session.push(offset=5, helper=NOTEBOOK["helper"])
    assert session.run("rank + offset") == [5, 6]
    assert session.run("helper(2)", rank=1) == 201
    assert session.run(lambda a, b=0: a + b, args=(3,), kwargs={"b": 4}) == [7, 7]
    import torch

    session.run("import torch\nweights = torch.full((2,), float(rank))")
    pulled = session.pull("weights", rank=1)
    assert isinstance(pulled, torch.Tensor) and pulled.tolist() == [1.0, 1.0]


def test_a_failing_command_keeps_the_ranks_and_their_namespace(session):
    before = [row["pid"] for row in session.status()]
    with pytest.raises(LaunchError) as info:
        session.run("kept = 'yes'\nif rank == 1:\n    raise KeyError('only on rank 1')\n")
    text = str(info.value)
    assert "rank 1 (first to fail) failed: KeyError" in text and "namespaces intact" in text
    assert info.value.failures[0].rank == 1
    assert session.run("kept") == ["yes", "yes"]
    assert [row["pid"] for row in session.status()] == before


def test_status_and_its_text_say_pid_device_memory_and_state(session):
    rows = session.status()
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["device"] == "cpu" and r["memory"] > 0 and r["state"] == "idle" for r in rows)
    text = status_text(session)
    assert "session of 2 ranks (gloo, fork)" in text
    for r in rows:
        assert str(r["pid"]) in text


def test_bad_requests_name_the_cause(session):
    with pytest.raises(SessionError, match="rank 5 does not exist"):
        session.run("1", rank=5)
    with pytest.raises(LaunchError, match="rank 0 has no variable 'nothing_here'"):
        session.pull("nothing_here")
    with pytest.raises(SyntaxError):
        session.run("def broken(:")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        Session(num_processes=2, no_such_option=1)
    with pytest.raises(LaunchSetupError, match="start_method"):
        Session(start_method="thread")
    with pytest.raises(SessionError, match="no session is running"):
        Session(num_processes=1, cpu=True).run("1")
    # a launch kind that cannot hold a session says so before anything starts (here: several machines)
    several = Session(
        num_processes=1, cpu=True, num_nodes=2, node_rank=0, master_addr="127.0.0.1", use_port=free_port()
    )
    with (
        pytest.warns(UserWarning, match="loopback address"),
        pytest.raises(LaunchSetupError, match="a session runs on this machine only, and num_nodes=2"),
    ):
        several.start()
    assert not several.running and several.log_dir is None


def test_a_rank_that_dies_breaks_the_session_and_restart_recovers(session):
    session.run("import torch.distributed as dist\nrank = dist.get_rank()")
    with pytest.raises(LaunchError) as info:
        session.run("import os\nif rank == 1:\n    os._exit(3)\n")
    assert "rank 1" in str(info.value) and "session is broken" in str(info.value)
    assert [r["state"] for r in session.status()][1] == "dead"
    with pytest.raises(SessionError, match="broken.*restart"):
        session.run("1")
    session.restart()
    assert session.run("import torch.distributed as dist\ndist.get_rank()") == [0, 1]
    assert session.run("'rank' in globals()") == [False, False]  # a fresh namespace after a restart
    # a rank killed while the session is idle: the next command names it and the signal
    import os
    import signal
    import time

    victim = session.status()[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while session.status()[0]["state"] != "dead" and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(SessionError, match="rank 0 died from SIGKILL.*restart"):
        session.run("1")
    session.restart()
    assert session.run("1") == [1, 1]


def test_launch_options_reach_the_ranks():
    with Session(
        num_processes=2, cpu=True, mixed_precision="bf16", env={"MY_SETTING": "x"}, progress="text"
    ) as s:
        code = "import os\nfrom accel_nb import Accelerator\n(Accelerator().mixed_precision, os.environ['MY_SETTING'])"
        assert s.run(code) == [("bf16", "x"), ("bf16", "x")]


def test_the_hang_watchdog_interrupts_a_silent_cell_and_the_session_stays_usable(session):
    session.run("import time\nalive = 'still here'")
    with pytest.raises(LaunchError) as info:
        # what %%accelerate --timeout 1 does
        session.run_cell("time.sleep(60)", "<accelerate-cell-99>", timeout=1.0)
    text = str(info.value)
    assert "hung: no rank made progress" in text and "interrupted" in text, text
    assert session.run("alive") == ["still here", "still here"]


def test_spawned_session_keeps_state_too():
    with Session(num_processes=2, cpu=True, start_method="spawn", progress="text") as s:
        assert s.plan.start_method == "spawn"
        s.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)")
        assert s.run("t.item()") == [2.0, 2.0]
        pids = [r["pid"] for r in s.status()]
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_start_flags_become_launch_options_and_gpu_ids_are_checked():
    from IPython.core.error import UsageError

    from accel_nb import hardware
    from accel_nb.notebook.session_magics import start_options

    options = start_options("-n 3 --cpu --mixed_precision bf16 --start_method spawn --timeout 30")
    assert (
        options.num_processes,
        options.cpu,
        options.mixed_precision,
        options.start_method,
        options.timeout,
    ) == (
        3,
        True,
        "bf16",
        "spawn",
        30.0,
    )
    found = hardware.cuda_device_count()
    with pytest.raises(UsageError, match=f"names GPU {found}, but this machine has {found} GPU"):
        start_options(f"--gpu_ids {found}")
    with pytest.raises(UsageError, match="exclude each other"):
        start_options("--gpu_ids 0 --cpu")
    with pytest.raises(UsageError, match="distinct GPU numbers"):
        start_options("--gpu_ids 0,0")


RESTART_AFTER_A_FAILED_START = """
import os
from accel_nb import LaunchError, Session
from accel_nb.launch.session import loop as session_worker

serve = session_worker.SessionLoop.serve
def rank_1_dies_at_once(self, runtime):
    if runtime.rank == 1:
        os._exit(7)
    return serve(self, runtime)

session_worker.SessionLoop.serve = rank_1_dies_at_once
s = Session(num_processes=2, cpu=True, progress="text")
try:
    s.start()
except LaunchError as err:
    print("FIRST", err.failures[0].summary(), "| logs kept:", os.path.isdir(err.log_dir))
session_worker.SessionLoop.serve = serve
s.start()  # at once: the notebook process is still importing torch in the background (warm)
print("VALUES", s.run("1"))
s.stop()
"""


def test_a_failed_start_names_the_rank_keeps_the_logs_and_the_next_start_works():
    """The first fork starts a background import of torch in the parent: the next start waits for it."""
    import os
    import subprocess
    import sys

    from accel_nb.launch.pythonpath import with_package_on_path

    env = with_package_on_path(dict(os.environ))
    res = subprocess.run(
        [sys.executable, "-c", RESTART_AFTER_A_FAILED_START],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = res.stdout + res.stderr
    assert "FIRST rank 1 exited with code 7" in out and "logs kept: True" in out, out
    assert res.returncode == 0 and "VALUES [1, 1]" in res.stdout, out
