"""A started rank process: the one small interface the supervisor needs, and the three kinds that start.

``RankProcess``: ``rank``, ``pid`` (also its process group), ``reader`` (its event channel), ``exit_fd``
(readable once the process has ended; None where the system has no pidfd), ``poll()`` (exit code or
None), ``signal_group(sig)`` and ``close()``. The supervisor needs nothing else. ``ForkedRank`` (a child
of the notebook), ``ServedRank`` (a child of the spawn server) and ``FreshRank`` (a fresh interpreter)
say how the exit status is learnt; ``start.py`` starts them. Every live rank dies with the kernel.

    proc.poll()          # None while it runs, then the exit code (negative: killed by that signal)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import subprocess
import threading
import time
import weakref

from .. import zygote
from ..channel import EventReader

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
