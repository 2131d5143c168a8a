"""Start the ranks of a plan: forked from the notebook, forked by the spawn server (``zygote``), or fresh interpreters.

The three kinds of process share one small interface, ``RankProcess``: ``rank``, ``pid`` (also
its process group), ``reader`` (its event channel), ``exit_fd`` (readable once the process has
ended; None where the system has no pidfd), ``poll()`` (exit code or None), ``signal_group(sig)``
and ``close()``. The supervisor needs nothing else.

    procs: list[RankProcess] = []
    start_ranks(plan, payload, log_dir, procs)     # procs fills as ranks start (cleanup sees them all)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from .. import kernel_debugger, preimport, zygote
from ..channel import EventReader
from ..payload import dumps_payload
from ..pythonpath import with_package_on_path
from ..rank.worker import RankSpec, fork_main, log_path

if TYPE_CHECKING:
    from ..plan import LaunchPlan

_live: weakref.WeakSet[RankProcess] = weakref.WeakSet()
_live_lock = threading.Lock()


class RankProcess:
    """One started rank. Subclasses say how its exit status is learnt (``_exit_status``)."""

    status_at_exit = True  # the exit status can be read as soon as the process has ended

    def __init__(self, rank: int, pid: int, reader: EventReader) -> None:
        self.rank = rank
        self.pid = pid
        self.reader = reader
        self.returncode: int | None = None
        self.exit_fd = exit_fd(pid)
        with _live_lock:
            _live.add(self)

    def _exit_status(self) -> int | None:
        raise NotImplementedError

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self.returncode is None:
            self.returncode = self._exit_status()
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """The exit code once the process has ended, waiting at most ``timeout`` seconds (None: still running)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self.exit_fd is not None and self.status_at_exit:
                waiter = select.poll()  # any fd number (select.select stops at 1024)
                waiter.register(self.exit_fd, select.POLLIN)
                waiter.poll(left * 1000)  # wakes when it ends
            else:  # learnt from elsewhere (the spawn server reports it): asked again shortly
                time.sleep(min(left, 0.01))
        return self.returncode

    @property
    def alive(self) -> bool:
        return self.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the rank's process group (its own children too), or to the rank alone."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.pid, sig)

    def close(self) -> None:
        self.reader.close()
        if self.exit_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.exit_fd)
            self.exit_fd = None
        with _live_lock:
            _live.discard(self)


def exit_fd(pid: int) -> int | None:
    """A pidfd of ``pid`` (Linux 5.3+): a selector wakes when the process ends, with no polling; None elsewhere."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, an old kernel, or the process is already reaped
        return None


class ForkedRank(RankProcess):
    """A child of the notebook process (fork)."""

    def _exit_status(self) -> int | None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (e.g. a SIGCHLD handler of the user's)
            return -255
        return os.waitstatus_to_exitcode(status) if pid else None


class ServedRank(RankProcess):
    """A child of the spawn server: the server reaps it and reports its exit."""

    status_at_exit = False  # the server reports it a little later

    def __init__(self, rank: int, pid: int, reader: EventReader, server: zygote.SpawnServer) -> None:
        super().__init__(rank, pid, reader)
        self.server = server

    def _exit_status(self) -> int | None:
        return self.server.returncode(self.pid)


class FreshRank(RankProcess):
    """A fresh interpreter started with ``subprocess.Popen``."""

    def __init__(self, rank: int, reader: EventReader, popen: subprocess.Popen) -> None:
        super().__init__(rank, popen.pid, reader)
        self.popen = popen

    def _exit_status(self) -> int | None:
        return self.popen.poll()


def _kill_all_at_exit() -> None:  # the kernel is going away: take every rank with it
    with _live_lock:
        procs = list(_live)
    for p in procs:
        p.signal_group(signal.SIGKILL)


atexit.register(_kill_all_at_exit)


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
