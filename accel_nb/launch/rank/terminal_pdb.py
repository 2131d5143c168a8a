"""``breakpoint()`` in a rank of ``accel-nb launch``: pdb on the launching terminal, named after the rank, one at a time.

``accel-nb launch`` sets ``PYTHONBREAKPOINT=accel_nb.launch.rank.terminal_pdb.set_trace`` for its ranks
(unless ``PYTHONBREAKPOINT`` is set already: ``0`` keeps breakpoints off, another hook stays the
user's). torchrun leaves each rank's stdin on the launching terminal and prefixes its output lines
(``[default1]:``). Several ranks at a breakpoint would read the same typed lines in turn, so a rank
holds a lock (``flock`` on a file named after the agent, the ranks' common parent) from the moment it
stops until ``c`` or ``q``: the others wait at their breakpoint, then get the terminal one after the
other. A rank whose stdin is not a terminal says so on its stderr and goes on (plain pdb would read
end-of-file and stop the rank with ``BdbQuit``). While a rank holds the lock, ``--timeout``'s hang
watchdog does not count the time (``rank_in_pdb``). A step still running after ``STEP_GRACE_S`` lets go
of the terminal (it may wait in a collective for a rank waiting at its breakpoint) and takes it back
when it stops.

    PYTHONBREAKPOINT=accel_nb.launch.rank.terminal_pdb.set_trace   # set by accel-nb launch
"""

from __future__ import annotations

import fcntl
import os
import pdb
import sys
import tempfile
import threading
from typing import Any

HOOK = "accel_nb.launch.rank.terminal_pdb.set_trace"  # the PYTHONBREAKPOINT value accel-nb launch sets
# a step (n, s, r) that has not stopped again after this long lets go of the terminal: it may wait in a
# collective for a rank that waits for the terminal at its breakpoint
STEP_GRACE_S = 1.0


def lock_path(agent_pid: int | None = None) -> str:
    """The lock every rank of one agent (torchrun's process on this machine) takes while in pdb."""
    return os.path.join(tempfile.gettempdir(), f"accel_nb-pdb-{agent_pid or os.getppid()}.lock")


def rank_in_pdb(agent_pid: int | None = None) -> bool:
    """Whether a rank of the agent ``agent_pid`` (default: this process) holds the terminal: it is in pdb, and
    the time a person spends there is not a hang (``accel-nb launch --timeout``'s watchdog asks)."""
    try:
        fd = os.open(lock_path(agent_pid or os.getpid()), os.O_RDWR)
    except OSError:  # no rank of this launch ever stopped
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


class TerminalPdb(pdb.Pdb):
    """pdb with ``(rank N Pdb)`` as its prompt that holds the terminal lock from its first stop until released."""

    def __init__(self) -> None:
        super().__init__(nosigint=True)  # Ctrl-C reaches the whole launch: torchrun stops it, as without pdb
        self.rank = os.environ.get("RANK", "?")
        self.prompt = f"(rank {self.rank} Pdb) "
        self._lock_fd: int | None = None
        self._guard = threading.Lock()  # the terminal lock's fd: this thread and the step timer
        self._step_timer: threading.Timer | None = None

    def _hold(self, frame: Any) -> None:
        if self._step_timer is not None:
            self._step_timer.cancel()
            self._step_timer.join()  # a release already under way is over before the lock is looked at
            self._step_timer = None
        with self._guard:
            if self._lock_fd is not None:
                return
        fd = os.open(lock_path(), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while another rank of this launch is in its pdb
        self._lock_fd = fd
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        self.message(f"[accel_nb] rank {self.rank} stopped in pdb{where}; 'c' lets it go on")

    def _release(self) -> None:
        with self._guard:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the file releases the lock
                self._lock_fd = None

    def interaction(self, frame: Any, traceback: Any) -> None:
        self._hold(frame)
        super().interaction(frame, traceback)
        if self._lock_fd is not None:  # a step: the terminal is let go if it does not stop again soon
            self._step_timer = threading.Timer(STEP_GRACE_S, self._release)
            self._step_timer.daemon = True
            self._step_timer.start()

    def set_continue(self) -> None:
        super().set_continue()
        self._release()

    def set_quit(self) -> None:
        super().set_quit()
        self._release()


def set_trace(*args: Any, **kwargs: Any) -> None:
    """What ``breakpoint()`` calls in a rank of ``accel-nb launch`` (through ``PYTHONBREAKPOINT``)."""
    frame = sys._getframe(1)
    try:
        tty = sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # a closed stdin
        tty = False
    if not tty:
        print(
            f"[accel_nb] rank {os.environ.get('RANK', '?')}: breakpoint at {frame.f_code.co_filename}:"
            f"{frame.f_lineno} skipped: stdin is not a terminal, so nobody can answer pdb",
            file=sys.stderr,
            flush=True,
        )
        return
    TerminalPdb().set_trace(frame)
