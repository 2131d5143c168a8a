"""Watch one command of an interactive session until every rank has answered; the ranks stay alive.

The same ``Supervisor`` as a one-shot launch (events, reporter, peer-lost rules, deaths, stacks),
with another ending: a rank is done with the command when it sent its ``Result`` or ``Failure``,
not when its process exits. A failure does not stop the other ranks. A rank still running the
command once another failed (or after the user pressed stop, or the hang watchdog fired) goes
through three steps, each only if the last did not end it:

1. its Python stacks are shown and it gets SIGINT (``KeyboardInterrupt`` in its code);
2. ``INTERRUPT_GRACE_S`` later, or ``COLLECTIVE_GRACE_S`` later when the stacks showed every rank
   still running blocked in a collective (SIGINT cannot reach Python code waiting inside gloo),
   ``on_stuck`` is called (the session closes the process group on the ranks that are done, which
   frees a peer waiting in a collective; the group is then broken, and the session forms a fresh
   one on the same ranks once the command is over);
3. it is killed (the session is then broken).

    outcome = CellSupervisor(procs, reporter, log_dir, on_stuck=session._free_stuck).run()
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import replace

from ...events import Event, Failure, FailureKind, Log, Reporter, Result, Stacks
from ..errors import RankFailure
from ..failures import describe
from ..parent.hang_blame import collective_of
from ..parent.start import RankProcess
from ..parent.supervisor import (
    FAILURE_GRACE_S,
    STACKS_WAIT_S,
    Outcome,
    Supervisor,
    SupervisorState,
    clean_stacks,
)
from ..rank.worker import STACKS_SIGNAL, stacks_path

# accel_nb/
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
INTERRUPT_GRACE_S = 2.0  # after SIGINT, how long a rank may take to raise KeyboardInterrupt and answer
# after SIGINT, how long a rank whose stacks show it blocked in a collective may take to answer before
# the group is closed under it: SIGINT reaches it only if the collective ends by itself meanwhile
COLLECTIVE_GRACE_S = 0.2
FREE_GRACE_S = 5.0  # after the group was closed under a stuck rank, how long until it is killed


_LIBRARY_FRAME = re.compile(
    r'File "[^"]*([/\\](site-packages|dist-packages|lib[/\\]python3\.\d+)[/\\]|<frozen )'
)


def _innermost_user_frame(traceback: str) -> str | None:
    """The last ``File ...`` line of a Python traceback that is the user's code (not torch's, not accel_nb's)."""
    frames = [ln.strip() for ln in traceback.splitlines() if ln.strip().startswith("File ")]
    for frame in reversed(frames):
        if not _LIBRARY_FRAME.search(frame) and _PACKAGE_DIR not in frame:
            return frame
    return frames[-1] if frames else None


class CellOutcome(Outcome):
    """``Outcome`` plus what happened to the session: ``group_broken``, ``killed`` ranks, ``interrupted``."""

    def __init__(self) -> None:
        super().__init__()
        self.group_broken = False
        self.killed: list[int] = []
        self.interrupted = False
        self.stuck_stacks: dict[int, str] = {}  # the stacks of the ranks still running when it was stopped
        self.stuck: list[int] = []  # the ranks that did not answer SIGINT (the group was closed under them)


class CellStep(enum.Enum):
    """How far the supervisor went to end a command that does not end by itself: the steps, in order."""

    RUNNING = "running"  # the command runs
    INTERRUPTED = "interrupted"  # the running ranks were sent SIGINT (their stacks shown first)
    # INTERRUPT_GRACE_S later: the process group was closed under them (on_stuck)
    GROUP_CLOSED = "group closed"
    KILLED = "killed"  # FREE_GRACE_S later: what still ran was killed


class CellSupervisor(Supervisor):
    """Supervise one session command on ``procs``; ``run()`` returns when each has answered or died."""

    def __init__(
        self,
        procs: list[RankProcess],
        reporter: Reporter,
        log_dir: str,
        timeout: float | None = None,
        on_stuck: Callable[[list[int]], None] | None = None,
    ) -> None:
        super().__init__(procs, reporter, log_dir, timeout=timeout)
        self.outcome = CellOutcome()
        self.on_stuck = on_stuck
        self.answered: set[int] = set()
        self._signalled: set[int] = set()  # ranks sent SIGINT by this supervisor
        self.step = CellStep.RUNNING
        self.step_since = 0.0  # when ``step`` was entered
        self._why = "failure"

    # -- events ---------------------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        if isinstance(event, (Result, Failure)):
            self.answered.add(event.rank)
            self.debug.rank_over(event.rank)  # out of pdb: its command is over
        if isinstance(event, Failure) and event.rank in self._signalled:
            # stopped by this supervisor (SIGINT, or the group closed under it): not a failure of its own
            if event.rank not in self.outcome.stopped:
                where = _innermost_user_frame(event.traceback)
                where = f" at {where}" if where else ""
                stopped = describe(replace(event, kind=FailureKind.INTERRUPTED), who="")
                self._report(Log(rank=event.rank, stream="stderr", text=f"{stopped}{where}\n"))
                self._mark_stopped(event.rank)
            return
        super()._handle(event)

    # -- stacks of some ranks -------------------------------------------------------------------
    def stacks_of(self, procs: list[RankProcess]) -> dict[int, str]:
        """The Python stacks of ``procs`` (faulthandler appends to a file per rank: read what is new)."""
        sizes = {}
        for p in procs:
            try:
                sizes[p.rank] = os.path.getsize(stacks_path(self.log_dir, p.rank))
            except OSError:
                sizes[p.rank] = 0
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, STACKS_SIGNAL)
        deadline = time.monotonic() + STACKS_WAIT_S
        stacks: dict[int, str] = {}
        while time.monotonic() < deadline and len(stacks) < len(procs):
            time.sleep(0.05)
            for p in procs:
                path = stacks_path(self.log_dir, p.rank)
                with contextlib.suppress(OSError), open(path, "rb") as f:
                    f.seek(sizes[p.rank])
                    text = f.read().decode("utf-8", "replace")
                    if text.strip():
                        stacks[p.rank] = text
        time.sleep(0.05)  # let faulthandler finish writing
        for p in procs:
            with contextlib.suppress(OSError), open(stacks_path(self.log_dir, p.rank), "rb") as f:
                f.seek(sizes[p.rank])
                text = f.read().decode("utf-8", "replace")
                if text.strip():
                    stacks[p.rank] = clean_stacks(text) or text
        return stacks

    # -- ending a command that will not end by itself -------------------------------------------
    def _still_running(self) -> list[RankProcess]:
        return [p for p in self.procs if p.rank not in self.answered and p.alive]

    def _interrupt_running(self, why: str) -> None:
        """Step 1: show where the running ranks are, then raise KeyboardInterrupt in them."""
        running = self._still_running()
        self._why = why
        self.step, self.step_since = CellStep.INTERRUPTED, time.monotonic()
        stacks = self.stacks_of(running)
        self.outcome.stuck_stacks.update(stacks)
        for rank, text in sorted(stacks.items()):
            self._report(Stacks(rank=rank, text=text, reason=why))
        for p in running:
            self._signalled.add(p.rank)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)  # the rank alone: its DataLoader workers are not interrupted

    def _advance(self, now: float) -> None:
        running = self._still_running()
        if not running:
            return
        if self.step is CellStep.RUNNING:
            if self.state is SupervisorState.FAILED and now - self.state_since >= FAILURE_GRACE_S:
                self._interrupt_running("interrupt")  # shown as "stacks when stopped"
            return
        if self.step is CellStep.INTERRUPTED and now - self.step_since >= self._grace(running):
            self.step, self.step_since = CellStep.GROUP_CLOSED, now
            self.outcome.group_broken = True
            self.outcome.stuck = sorted(p.rank for p in running)
            if self.on_stuck is not None:
                self.on_stuck([p.rank for p in running])
        elif self.step is CellStep.GROUP_CLOSED and now - self.step_since >= FREE_GRACE_S:
            self.step, self.step_since = CellStep.KILLED, now
            for p in running:
                self.outcome.killed.append(p.rank)
                p.signal_group(signal.SIGKILL)

    def _grace(self, running: list[RankProcess]) -> float:
        """How long the running ranks get to answer SIGINT: short when each is blocked in a collective."""
        stacks = self.outcome.stuck_stacks
        if all(collective_of(stacks.get(p.rank, "")) for p in running):
            return COLLECTIVE_GRACE_S
        return INTERRUPT_GRACE_S

    def on_rank_exit(self, proc: RankProcess) -> None:
        if proc.rank in self.outcome.killed:
            self._drain(proc)
            if proc.rank not in self.outcome.failures:
                stuck = RankFailure(
                    proc.rank,
                    None,
                    "it did not answer SIGINT nor the closing of the process group, so it was killed",
                    self.outcome.stuck_stacks.get(proc.rank, ""),
                    kind=FailureKind.STUCK,
                )
                self._add_failure(stuck, stop_the_rest=False)  # the last step: nothing left to stop
            return
        super().on_rank_exit(proc)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> CellOutcome:
        """Supervise until every rank answered or died; a KeyboardInterrupt ends the command on every rank, then propagates."""
        sel = selectors.DefaultSelector()
        for p in self.procs:
            if not p.reader.eof:
                sel.register(p.reader.fd, selectors.EVENT_READ, p)
        waiting = {p.rank: p for p in self.procs}
        try:
            while waiting:
                try:
                    self._loop_once(sel, waiting)
                except KeyboardInterrupt:
                    if self.outcome.interrupted:
                        continue  # a second stop: the steps above are already under way
                    self.outcome.interrupted = True
                    self._interrupt_running("interrupt")
        finally:
            sel.close()
            self.debug.close()
        if self.outcome.interrupted:
            raise KeyboardInterrupt
        return self.outcome

    def _done_while_alive(self, rank: int) -> bool:
        return rank in self.answered  # a session rank answers and stays alive for the next command

    def _loop_once(self, sel: selectors.BaseSelector, waiting: dict[int, RankProcess]) -> None:
        self._read_and_reap(sel, waiting)
        now = time.monotonic()
        self._settle_peer_lost(now, final=not waiting)
        self._advance(now)
        self._tick()
        if (
            self.timeout is not None
            and waiting
            and self.step is CellStep.RUNNING
            and not self.outcome.failures
        ):
            idle = now - self._last_progress
            if idle >= self.timeout:
                self.outcome.hung_after = idle
                self._interrupt_running("hang")
