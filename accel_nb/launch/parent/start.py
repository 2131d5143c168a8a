"""Start the ranks of a plan: forked from the notebook, forked by the spawn server (``zygote``), or fresh interpreters.

The three kinds of process share one small interface, ``RankProcess`` (``rank_process.py``, with the
three kinds).

    procs: list[RankProcess] = []
    start_ranks(plan, payload, log_dir, procs)     # procs fills as ranks start (cleanup sees them all)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from .. import kernel_debugger, preimport, zygote
from ..channel import EventReader
from ..payload import dumps_payload
from ..pythonpath import with_package_on_path
from ..rank.worker import RankSpec, fork_main, log_path
from .rank_process import ForkedRank, FreshRank, RankProcess, ServedRank

if TYPE_CHECKING:
    from ..plan import LaunchPlan


def start_ranks(plan: LaunchPlan, payload: Any, log_dir: str, procs: list[RankProcess]) -> None:
    """Start every rank of ``plan`` into ``procs`` (filled as they start, so a half-done start can be cleaned up)."""
    if plan.start_method == "fork":
        start_forked(plan, payload, log_dir, procs)
        preimport.start_in_kernel()  # later forked ranks inherit what their first DDP step imports
        return
    payload_path = os.path.join(log_dir, "payload.pkl")
    with open(payload_path, "wb") as f:
        f.write(dumps_payload(payload))
    spec_file = os.path.join(log_dir, "spec.json")
    base = RankSpec(
        0, plan.num_processes, log_dir, -1, os.getpid(), False, {}, list(sys.path), os.getcwd(), payload_path
    )
    with open(spec_file, "w") as f:
        f.write(base.to_json())
    server = None
    if zygote.enabled():
        try:
            server = zygote.get_server()
        except zygote.SpawnServerError as exc:
            print(
                f"[accel_nb] the spawn server is unavailable ({exc}); starting fresh interpreters",
                file=sys.stderr,
            )
    if server is not None:
        start_served(plan, server, spec_file, log_dir, procs)
    else:
        start_fresh(plan, spec_file, log_dir, procs)


def start_forked(plan: LaunchPlan, payload: Any, log_dir: str, procs: list[RankProcess]) -> None:
    """Fork one child per rank; each runs ``fork_main`` with the payload already in its memory.

    SIGINT is blocked in this thread around each fork: the child inherits the block, so a Ctrl-C
    sent to the kernel's process group before the child has its own group cannot raise
    KeyboardInterrupt into the notebook's code in the child (the worker unblocks it once set up).
    """
    parent_pid = os.getpid()
    preimport.wait()  # never fork while the background import holds an import lock
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush
            stream.flush()
    for rank in range(plan.num_processes):
        r, w = os.pipe()
        spec = RankSpec(
            rank,
            plan.num_processes,
            log_dir,
            w,
            parent_pid,
            True,
            plan.rank_env(rank),
            threads=plan.fork_threads,
        )
        # the parent's ends: the child must not hold them
        inherited = [r] + [p.reader.fd for p in procs] + [p.exit_fd for p in procs if p.exit_fd is not None]
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = kernel_debugger.fork()  # not debugpy's fork hook: the child would wait to be attached
            if pid == 0:  # child
                fork_main(spec, payload, close_fds=inherited)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        os.close(w)
        with contextlib.suppress(OSError):  # the child may have set it (or exited) already
            os.setpgid(pid, pid)  # both sides set it: no race with an early killpg
        procs.append(ForkedRank(rank, pid, EventReader(r, rank)))


def start_served(
    plan: LaunchPlan, server: zygote.SpawnServer, spec_file: str, log_dir: str, procs: list[RankProcess]
) -> None:
    """Ask the spawn server (``zygote``) to fork each rank (a clean interpreter that never touched CUDA)."""
    for rank in range(plan.num_processes):
        r, w = os.pipe()
        env = dict(os.environ)
        env.update(plan.rank_env(rank))
        log_fd = os.open(log_path(log_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            pid = server.start_rank(spec_file, rank, env, w, log_fd, last=rank == plan.num_processes - 1)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
            os.close(log_fd)
        procs.append(ServedRank(rank, pid, EventReader(r, rank), server))


def start_fresh(plan: LaunchPlan, spec_file: str, log_dir: str, procs: list[RankProcess]) -> None:
    """Start one fresh interpreter per rank; each loads the cloudpickled payload named in ``spec_file``."""
    code = "from accel_nb.launch.rank.worker import spawn_main; spawn_main()"
    for rank in range(plan.num_processes):
        r, w = os.pipe()
        env = dict(os.environ)
        env.update(plan.rank_env(rank))
        with_package_on_path(env)
        try:
            with (
                open(log_path(log_dir, rank), "ab") as early_log,  # output before the capture starts
                kernel_debugger.unpatched_subprocesses(),
            ):
                popen = subprocess.Popen(
                    [sys.executable, "-c", code, spec_file, str(rank), str(w)],
                    pass_fds=(w,),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=early_log,
                    stderr=early_log,
                    start_new_session=True,  # its own process group (killpg), Python 3.10 too
                )
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        procs.append(FreshRank(rank, EventReader(r, rank), popen))
