"""The end of a launch: what a launch leaves behind, and a launch right after another.

A launch's log folder lives until the next launch or the end of the process when a failure or a
note names it, and is removed at once otherwise; a second launch on the same fixed port starts at
once after the first returned (rank 0's store is gone), with DDP ranks that end without tearing
their group down and without an abort.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from accel_nb import debug_launcher
from accel_nb.launch.parent.reporting import ListReporter
from accel_nb.launch.ports import pick_free_port
from tests.process_helpers import live_descendants

pytestmark = pytest.mark.multiproc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FOLDERS_SCRIPT = textwrap.dedent(
    """
    import glob, os, sys, tempfile
    from accel_nb import debug_launcher
    from accel_nb.launch.errors import LaunchError
    from accel_nb.launch.parent.reporting import ListReporter

    def folders():
        return sorted(glob.glob(os.path.join(tempfile.gettempdir(), "accel_nb-launch-*")))

    def ok():
        return 1

    def fails():
        raise ValueError("boom")

    def fail():
        try:
            debug_launcher(fails, reporter=ListReporter())
        except LaunchError as err:
            return err.log_dir
        raise AssertionError("the launch did not fail")

    seen = []
    assert debug_launcher(ok, reporter=ListReporter()) == [1, 1]
    seen.append(len(folders()))  # a successful launch: nothing left
    failed = fail()
    seen.append(folders() == [failed] and os.path.isfile(os.path.join(failed, "rank0.log")))  # named: kept
    assert debug_launcher(ok, reporter=ListReporter()) == [1, 1]
    seen.append(len(folders()))  # the next launch removed it
    failed = fail()
    seen.append(folders() == [failed])
    print("SEEN", seen, flush=True)
    # the process ends here: the last failure's folder goes with it
    """
)


def test_a_launch_leaves_no_log_folder_past_the_next_launch_or_the_process(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", _FOLDERS_SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SEEN [0, True, 0, True]" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert glob.glob(str(tmp_path / "accel_nb-launch-*")) == []  # removed when the process ended


def _ddp_step(port: int) -> tuple[int, str]:
    import torch

    from accel_nb import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.ones(2, 4)).sum())  # DDP's gloo allreduce
    opt.step()
    return accelerator.num_processes, os.environ["MASTER_PORT"]


def test_a_launch_right_after_another_on_the_same_port_is_undisturbed():
    port = pick_free_port()
    reporters = [ListReporter(), ListReporter()]
    for rep in reporters:  # back to back: the second starts as soon as the first returned
        assert debug_launcher(_ddp_step, args=(port,), use_port=port, reporter=rep) == [(2, str(port))] * 2
        assert not live_descendants(psutil.Process())  # every rank is gone when the launch returns
        assert rep.finished == (True, None)
        for rank in (0, 1):  # the ranks left without tearing the group down, and without an abort
            assert "terminate called" not in rep.output(rank=rank) + rep.output(rank=rank, stream="stderr")


def _late_subgroup():
    """Rank 0 is not in the group it creates and returns at once; rank 1 creates its group later.

    The group's handshake goes through the store rank 0 hosts: rank 0 must not end before rank 1 is
    done with it (in CI a DeviceMesh's groups once failed this way: "Connection reset by peer").
    """
    import time

    import torch.distributed as dist

    from accel_nb import PartialState

    state = PartialState()
    if state.process_index == 1:
        time.sleep(0.5)  # makes the race likely without the exit barrier; with it, any delay passes
    group = dist.new_group([1])
    if state.process_index == 1:
        dist.all_reduce(__import__("torch").ones(1), group=group)
    return state.process_index


def test_rank_zero_outlives_a_peer_still_forming_a_group():
    assert debug_launcher(_late_subgroup) == [0, 1]


def _late_subgroup_as_nccl():
    """The same race on the path backends without ``monitored_barrier`` take (NCCL): the rank's
    ``torch.distributed`` reports another backend than gloo, so that at the end rank 0, the store's
    host, waits for every rank's check-out on the store instead of a gloo barrier."""
    import torch.distributed as dist

    index = _late_subgroup()
    dist.get_backend = lambda group=None: "nccl"  # the rank ends right after: nothing else sees it
    return index


def test_rank_zero_outlives_a_peer_still_forming_a_group_without_a_gloo_barrier():
    assert debug_launcher(_late_subgroup_as_nccl) == [0, 1]


_DIES_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from accel_nb import debug_launcher
    from accel_nb.launch.errors import LaunchError
    from accel_nb.launch.parent.reporting import ListReporter

    def fails():
        raise ValueError("boom")

    try:
        debug_launcher(fails, reporter=ListReporter())
    except LaunchError as err:
        print("KEPT", err.log_dir, flush=True)
    if sys.argv[1] == "die":
        os._exit(0)  # as a kernel killed by its manager: no atexit, the named folder stays
    sys.stdin.read()  # "live": holds its folder until the test closes stdin
    """
)


def test_a_folder_a_killed_process_left_is_removed_by_the_next_launch_of_any_process(tmp_path):
    from accel_nb.launch.parent import log_dirs

    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=ROOT)

    def kept_folder(proc_out: str) -> str:
        return next(line.split(" ", 1)[1] for line in proc_out.splitlines() if line.startswith("KEPT "))

    dead = subprocess.run(
        [sys.executable, "-c", _DIES_SCRIPT, "die"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert dead.returncode == 0, dead.stderr[-3000:]
    orphan = kept_folder(dead.stdout)
    assert os.path.isfile(os.path.join(orphan, "rank0.log"))  # left behind by the process that died
    live = subprocess.Popen(
        [sys.executable, "-c", _DIES_SCRIPT, "live"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        while not line.startswith("KEPT "):
            line = live.stdout.readline()
            assert line, "the live process ended before its launch failed"
        held = kept_folder(line)  # its launch swept the orphan as it started
        assert not os.path.exists(orphan)
        older = tmp_path / "accel_nb-launch-olderrelease"  # no owner file: not ours to judge
        older.mkdir()
        old_tempdir = log_dirs.tempfile.tempdir
        log_dirs.tempfile.tempdir = str(tmp_path)
        try:
            assert log_dirs.sweep_orphans("accel_nb-launch-") == []  # the live process still holds its folder
            assert os.path.isdir(held) and older.is_dir()
        finally:
            log_dirs.tempfile.tempdir = old_tempdir
    finally:
        live.stdin.close()  # the live process ends normally: its atexit removes its folder
        assert live.wait(timeout=600) == 0
    assert not os.path.exists(held) and older.is_dir()
