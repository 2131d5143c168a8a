"""``accel-nb launch --timeout``: the hang watchdog of the script face (issue 38, item 2).

No output from any rank for ``--timeout`` seconds is a hang: every rank's Python stack is shown, with
the notebook face's words (who waits in which collective, who is the likely cause), every rank is
stopped and the exit code is 124. The ranks run the script through ``accel_nb/launch/rank/script_main.py``
(faulthandler on the stacks signal), which must behave as ``python script.py`` does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from accel_nb.commands.launch import torchrun_arguments
from accel_nb.config import default_config
from accel_nb.env_names import ENV_LAUNCH_TIMEOUT
from accel_nb.launch.elastic.watchdog import HANG_EXIT_CODE, RANK_MAIN, launch_timeout
from accel_nb.launch.rank.worker import STACKS_SIGNAL
from tests.test_cli import EXAMPLE, ROOT, accel_nb

SIG = str(int(STACKS_SIGNAL))

HANG_SCRIPT = """\
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
flag = sys.argv[1]
if dist.get_rank() == 1:
    while not os.path.exists(flag):  # output (progress) until rank 0 is about to enter the collective
        print("rank 1 still working", flush=True)
        time.sleep(0.2)
    time.sleep(600)  # line 14: the cause, no collective and no output
open(flag, "w").close()
dist.all_reduce(torch.ones(1))  # line 16: rank 0 waits here for rank 1
"""


@pytest.fixture
def cfg(tmp_path) -> str:
    return str(tmp_path / "cfgdir" / "default_config.yaml")


def _left_behind(marker: str) -> list[psutil.Process]:
    """Processes whose command line names ``marker`` (a test's own tmp path), after a short wait."""
    deadline = time.monotonic() + 10
    while True:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            if marker in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                found.append(p)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.multiproc
def test_a_hung_script_names_the_rank_that_is_not_in_the_collective(cfg, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG_SCRIPT)
    flag = str(tmp_path / "entering")
    out = accel_nb(
        "launch", "--cpu", "--num_processes", "2", "--timeout", "3", str(script), flag, cfg=cfg, timeout=200
    )
    err = out.stderr
    assert out.returncode == HANG_EXIT_CODE, err
    print(err)  # the launch's report, for the record
    assert re.search(
        r"accel-nb launch: the launch hung: no rank made progress for \d+ s \(timeout=3\); ", err
    )
    assert (
        "rank 0 waits in a collective (all_reduce); rank 1 is not: the likely cause, it is waited for "
        f"(at <module>, line 14 of {script}); each rank's Python stack is below, every rank was stopped"
    ) in err
    # both stacks, the likely cause first, and rank 0's own line as notebook_launcher words it
    stacks_1, stacks_0 = err.index("Python stacks of rank 1:"), err.index("Python stacks of rank 0:")
    assert stacks_1 < stacks_0
    assert f'File "{script}", line 14 in <module>' in err[stacks_1:stacks_0]
    assert " in all_reduce" in err[stacks_0:] and f'File "{script}", line 16 in <module>' in err[stacks_0:]
    assert re.search(r"\nrank 0 hung: waited in a collective \(all_reduce\) for \d+ s; it was stopped\n", err)
    assert "script_main.py" not in err  # the rank-side wrapper's frames are not the user's
    assert "death signal" not in err and "closing signal" not in err  # torch's lines about our SIGTERM
    log_dir = re.search(r"full per-rank logs: (\S+)", err)[1]
    assert os.path.isdir(log_dir)
    assert _left_behind(str(script)) == []


@pytest.mark.multiproc
def test_a_script_that_prints_more_often_than_the_timeout_is_not_a_hang(cfg, tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(
        "import os, time\n"
        "start = time.monotonic()\n"
        "while time.monotonic() - start < 10:  # two and a half timeouts long, never quiet for one\n"
        "    print('rank', os.environ['RANK'], 'working', flush=True)\n"
        "    time.sleep(0.05)  # 80 lines per timeout: only a rank starved for 4 s would look hung\n"
        "print('rank', os.environ['RANK'], 'done', flush=True)\n"
    )
    out = accel_nb("launch", "--cpu", "--num_processes", "2", "--timeout", "4", str(script), cfg=cfg)
    assert out.returncode == 0, out.stderr
    assert "rank 0 done" in out.stdout and "rank 1 done" in out.stdout
    assert "hung" not in out.stderr


@pytest.mark.multiproc
def test_with_a_timeout_a_failing_rank_is_summarised_as_before(cfg):
    env = {ENV_LAUNCH_TIMEOUT: "120"}  # the variable, not the flag
    out = accel_nb("launch", "--num_processes", "2", EXAMPLE, "--fail-on-rank", "1", cfg=cfg, env=env)
    assert out.returncode in (1, 134), out.stderr  # 134: gloo's threads abort at exit after the exception
    assert "hang timeout 120 s" in out.stderr
    assert "rank 1 failed first: ValueError: rank 1 was asked to fail (" in out.stderr
    assert "hung" not in out.stderr


def test_a_bad_timeout_is_refused_before_anything_starts(cfg):
    out = accel_nb("launch", "--timeout", "0", "x.py", cfg=cfg)
    assert out.returncode == 2 and "--timeout" in out.stderr
    out = accel_nb("launch", "--cpu", EXAMPLE, cfg=cfg, env={ENV_LAUNCH_TIMEOUT: "soon"})
    assert out.returncode == 2
    assert (
        "accel-nb launch: error: ACCEL_NB_LAUNCH_TIMEOUT='soon' is not a number of seconds above 0"
        in out.stderr
    )


def test_launch_timeout_reads_the_flag_then_the_environment():
    assert launch_timeout(None, {}) is None
    assert launch_timeout(None, {ENV_LAUNCH_TIMEOUT: " 90 "}) == 90.0
    assert launch_timeout(30.0, {ENV_LAUNCH_TIMEOUT: "90"}) == 30.0
    for bad in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(ValueError, match=ENV_LAUNCH_TIMEOUT):
            launch_timeout(None, {ENV_LAUNCH_TIMEOUT: bad})


def test_only_a_timeout_runs_the_script_through_the_rank_file():
    cfg = default_config().replace(num_processes=2, use_cpu=True, distributed_type="MULTI_CPU")
    plain = torchrun_arguments(cfg, 2, "train.py", ["--lr", "1"], "/logs", endpoint=("127.0.0.1", 29500))
    assert plain[-3:] == ["train.py", "--lr", "1"] and "--no-python" not in plain
    watched = torchrun_arguments(
        cfg, 2, "train.py", ["--lr", "1"], "/logs", endpoint=("127.0.0.1", 29500), stacks_dir="/logs/s"
    )
    tail = watched[watched.index("--no-python") :]
    assert tail == [
        "--no-python",
        sys.executable,
        "-u",
        RANK_MAIN,
        "/logs/s",
        SIG,
        "file",
        "train.py",
        "--lr",
        "1",
    ]
    module = torchrun_arguments(
        cfg, 2, "pkg.train", [], "/logs", True, endpoint=("127.0.0.1", 29500), stacks_dir="/s"
    )
    assert "--module" not in module and module[-2:] == ["module", "pkg.train"]
    from torch.distributed.run import parse_args

    parsed = parse_args(watched)  # torchrun reads them as a command to start, python included
    assert parsed.no_python and parsed.training_script == sys.executable
    assert parsed.training_script_args == ["-u", RANK_MAIN, "/logs/s", SIG, "file", "train.py", "--lr", "1"]


PROBE = """\
'''the probe's docstring'''
import pickle
import sys

import helper  # beside the script: sys.path[0] is the script's folder


class Point:
    pass


print("argv", sys.argv, "path0", sys.path[0], "file", __file__, "name", __name__, "doc", __doc__)
print("helper", helper.VALUE, "pickled", type(pickle.loads(pickle.dumps(Point()))).__name__)
print("dunders", sorted(k for k in globals() if k.startswith("__")))
if sys.argv[1:] == ["raise"]:
    def fail():
        raise ValueError("boom")
    fail()
if sys.argv[1:] == ["exit"]:
    sys.exit(7)
"""


@pytest.mark.parametrize("how", ["ok", "raise", "exit"])
@pytest.mark.parametrize("module", [False, True])
def test_the_rank_file_runs_a_script_as_python_does(tmp_path, how, module):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    (folder / "helper.py").write_text("VALUE = 42\n")
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    env = dict(os.environ, RANK="3", PYTHONPATH=ROOT)
    cwd = str(folder) if module else str(tmp_path)
    target = ["-m", "probe"] if module else ["code/probe.py"]
    plain = subprocess.run(
        [sys.executable, "-u", *target, how], capture_output=True, text=True, env=env, cwd=cwd
    )
    kind = ["module", "probe"] if module else ["file", "code/probe.py"]
    wrapped = subprocess.run(
        [sys.executable, "-u", RANK_MAIN, str(stacks), SIG, *kind, how],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
    assert wrapped.returncode == plain.returncode == {"ok": 0, "raise": 1, "exit": 7}[how]
    assert wrapped.stdout == plain.stdout
    assert "helper 42 pickled Point" in wrapped.stdout
    if module:  # python -m shows runpy's frames, the rank file does not: the user's frames are the same
        strip = re.compile(r'  File "<frozen runpy>".*\n.*\n')
        assert wrapped.stderr == strip.sub("", plain.stderr)
    else:
        assert wrapped.stderr == plain.stderr
    assert (stacks / "rank_3.pid").read_text().isdigit() and (stacks / "rank_3.stacks").exists()


LATE_SIGNAL = """
import atexit, faulthandler, os, signal, sys

def shutting_down():
    # what interpreter shutdown does after atexit (faulthandler switched off), then the watchdog's late
    # stacks request to a rank that was slow to leave (its process group, say)
    faulthandler.unregister(int(sys.argv[1]))
    os.kill(os.getpid(), int(sys.argv[1]))
    print("still here", flush=True)

atexit.register(shutting_down)
print("done", flush=True)
"""


def test_a_rank_that_finished_is_not_killed_by_a_late_stacks_request(tmp_path):
    (tmp_path / "late.py").write_text(LATE_SIGNAL)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    env = dict(os.environ, RANK="0", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-u", RANK_MAIN, str(stacks), SIG, "file", "late.py", SIG],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, (done.returncode, done.stderr)  # was -SIGUSR1: killed after its work
    assert done.stdout == "done\nstill here\n"
