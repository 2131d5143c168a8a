"""Watch started ranks until they end: events, exits, failures, interrupts, the hang watchdog, clean-up.

The loop runs in the thread that called the launcher (in Jupyter: the cell's own thread), so
everything the reporter prints lands in the launching cell. The first failure stops the other
ranks; a rank that fails only because a peer died (gloo "Connection closed by peer") counts as
stopped. On a hang (``timeout``) or a KeyboardInterrupt every rank's Python stack is collected
and reported before the ranks are stopped.

    outcome = Supervisor(procs, reporter, log_dir, timeout=60).run()
    outcome.results, outcome.failures, outcome.stopped
"""

from __future__ import annotations

import contextlib
import enum
import os
import selectors
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ...events import Dropped, Event, Failure, FailureKind, Heartbeat, Phase, Reporter, Result, Role, Stacks
from ..errors import RankFailure
from ..failures import FirstToFail, lost_a_peer, signal_name
from ..rank.worker import STACKS_SIGNAL, crash_path, log_path, stacks_path
from .hang_blame import HUNG_CULPRIT, Blame, blame_stacks
from .rank_debugger import DebugDesk
from .start import RankProcess

STARTUP_GRACE_S = 120.0  # the watchdog allows at least this long until every rank runs the payload
FAILURE_GRACE_S = 0.5  # after a first failure, let the others report their own errors this long
TERM_GRACE_S = 2.0  # SIGTERM -> SIGKILL
# how long the watchdog waits at most for faulthandler to write the stacks (a loaded machine)
STACKS_WAIT_S = 3.0
POLL_S = 0.05  # the loop's longest wait for an event; the watchdog and the reporter's tick run between waits
# a rank's exit wakes the loop through its pidfd (``RankProcess.exit_fd``); where there is none (or the
# spawn server has not reported the exit yet) and every pipe is closed, the exit is polled from this
# interval up (doubling to POLL_S): a launch ends when its last rank has exited, not up to POLL_S later
EXIT_POLL_S = 0.001


@dataclass
class Outcome:
    """What the supervisor saw: results by rank, failures, who it stopped, whether it was a hang."""

    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    stopped: list[int] = field(default_factory=list)
    hung_after: float | None = None
    hang_blame: Blame | None = None  # after a hang: who waited in a collective, who did not
    # ranks whose output was not all shown (see the logs)
    dropped_output: set[int] = field(default_factory=set)
    roles: dict[int, Role] = field(default_factory=dict)  # the last role each rank told (mesh or stage)
    interrupt_stacks: dict[int, str] = field(
        default_factory=dict
    )  # where each rank was when the user stopped


def _from_event(event: Failure) -> RankFailure:
    """The ``RankFailure`` a rank's ``Failure`` event tells of."""
    return RankFailure(
        event.rank,
        event.exc_type,
        event.message,
        event.traceback,
        exit_code=event.exit_code,
        signal=event.signal,
        exception=event.exception,
        kind=event.kind,
    )


def _hang_message(rank: int, idle: float, blame: Blame) -> str:
    """What the hang watchdog says of ``rank``, from what its stacks and the others' show."""
    if rank in blame.waiting:
        return f"waited in a collective ({blame.waiting[rank]}) for {idle:.0f} s; it was stopped"
    waiters = sorted(blame.waiting)
    where = blame.elsewhere.get(rank)
    if rank in blame.likely_cause:
        who = f"rank{'s' if len(waiters) > 1 else ''} {', '.join(map(str, waiters))}"
        at = f" at {where}" if where else " (it did not answer with a stack)"
        return (
            f"no progress for {idle:.0f} s, not in a collective while {who} waited in one: the likely cause{at}; "
            "it was stopped"
        )
    return f"no progress for {idle:.0f} s{f' at {where}' if where else ''}; it was stopped"


def hang_failures(stacks: dict[int, str], ranks: list[int], idle: float) -> tuple[Blame, list[RankFailure]]:
    """What the stacks of the hung ``ranks`` show, and one ``HANG`` failure per rank, the likely cause first.

    Both faces of the launcher say a hang with these (``notebook_launcher(timeout=)``, ``accel-nb launch --timeout``).
    """
    blame = blame_stacks(stacks, ranks)
    cause = blame.likely_cause
    failures = []
    for rank in sorted(ranks, key=lambda r: (r not in cause, r)):  # the likely cause first
        text = stacks.get(rank, "(no stack: the rank did not answer)")
        failure = RankFailure(
            rank,
            None,
            _hang_message(rank, idle, blame),
            f"Python stacks of rank {rank}:\n{text}",
            kind=FailureKind.HANG,
        )
        failures.append(failure)
    return blame, failures


def hang_headline(idle: float, timeout: float, blame: Blame | None) -> str:
    """The first line of a hang's report: how long nothing moved, who waits for whom, what follows."""
    said = blame.sentence() + "; " if blame is not None else ""
    return (
        f"the launch hung: no rank made progress for {idle:.0f} s (timeout={timeout:g}); "
        f"{said}each rank's Python stack is below, every rank was stopped"
    )


def read_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


_LAUNCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # accel_nb/launch
_INTERNAL_THREADS = ("in _pump", "in _heartbeat")


def clean_stacks(text: str) -> str:
    """faulthandler output without the launcher's own threads and frames (the user's frames stay)."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    kept: list[str] = []
    for block in blocks:
        lines = block.splitlines()
        if block.startswith("Extension modules") or any(
            _LAUNCH_DIR in line and line.rstrip().endswith(_INTERNAL_THREADS) for line in lines
        ):
            continue
        out: list[str] = []
        for line in lines:
            if _LAUNCH_DIR in line:
                break  # below the first launcher frame: the worker entry and the notebook that forked it
            out.append(line)
        kept.append("\n".join(out))
    return "\n\n".join(kept)


class SupervisorState(enum.Enum):
    """Where a launch stands in stopping its ranks: the steps after a first failure, in order."""

    RUNNING = "running"  # no rank failed (yet)
    FAILED = "failed"  # a first rank failed: the others have FAILURE_GRACE_S to report their own failures
    TERMINATING = "terminating"  # SIGTERM sent to every live rank; a rank that ends now was stopped
    KILLED = "killed"  # SIGKILL sent to what was left TERM_GRACE_S after SIGTERM


class Supervisor:
    """Feed events to the reporter, decide when ranks failed, stop the rest, watch for hangs."""

    def __init__(
        self, procs: list[RankProcess], reporter: Reporter, log_dir: str, timeout: float | None = None
    ) -> None:
        self.procs = procs
        self.reporter = reporter
        self.log_dir = log_dir
        self.timeout = timeout
        self.outcome = Outcome()
        self.state = SupervisorState.RUNNING
        self.state_since = time.monotonic()  # when ``state`` was entered
        self._first_to_fail = FirstToFail()
        self._last_progress = time.monotonic()
        self._running: set[int] = set()  # ranks that reached the payload (startup is over for them)
        self._peer_lost: dict[int, tuple[Failure, float]] = {}  # held until it is clear whether a peer died
        self._exit_wait = EXIT_POLL_S  # the next wait once every pipe is closed (see EXIT_POLL_S)
        self.debug = DebugDesk(procs, self._report)  # ranks at a breakpoint(): their pdb prompts

    # -- events -------------------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        if not isinstance(event, Heartbeat):
            self._last_progress = time.monotonic()
        if self.debug.take(event):
            return
        if isinstance(event, (Result, Failure)):
            self.debug.rank_over(event.rank)
        if isinstance(event, Phase) and event.phase == "running":
            self._running.add(event.rank)
        if isinstance(event, Dropped):
            self.outcome.dropped_output.add(event.rank)
        if isinstance(event, Role):
            self.outcome.roles[event.rank] = event
        if isinstance(event, Result):
            self.outcome.results[event.rank] = event.value
        elif isinstance(event, Failure):
            if event.rank in self.outcome.failures or event.rank in self._peer_lost:
                return
            if lost_a_peer(event):
                self._peer_lost[event.rank] = (event, time.monotonic())
                return  # reported by _settle_peer_lost: as stopped when a peer died, else as a failure
            self._add_failure(_from_event(event))
        self._report(event)

    def _report(self, event: Event) -> None:
        try:
            self.reporter.handle(event)
        except Exception as exc:  # noqa: BLE001 - a broken display must not break the launch
            print(f"[accel_nb] the reporter failed on {type(event).__name__}: {exc}", file=sys.stderr)

    def _tick(self) -> None:
        """Let the reporter redraw what time alone changes (quiet ranks' rows), from this thread."""
        try:
            self.reporter.tick()
        except Exception as exc:  # noqa: BLE001 - a broken display must not break the launch
            print(f"[accel_nb] the reporter failed to redraw: {exc}", file=sys.stderr)

    def _add_failure(self, failure: RankFailure, stop_the_rest: bool = True) -> None:
        """Record ``failure`` (is it the first?); the first one stops the other ranks unless told not to."""
        failure.first = self._first_to_fail.record(failure.rank)
        if failure.first and stop_the_rest:
            self._enter(SupervisorState.FAILED, time.monotonic())
        self.outcome.failures[failure.rank] = failure

    def _mark_stopped(self, rank: int) -> None:
        if rank not in self.outcome.stopped:
            self.outcome.stopped.append(rank)
            self._report(Phase(rank=rank, phase="stopped"))

    def _settle_peer_lost(self, now: float, final: bool = False) -> None:
        """A rank that lost a peer was stopped by the peer's failure; with no such failure it failed itself."""
        for rank, (event, seen_at) in list(self._peer_lost.items()):
            if self.outcome.failures:
                del self._peer_lost[rank]
                self._mark_stopped(rank)
            elif final or now - seen_at >= FAILURE_GRACE_S:
                del self._peer_lost[rank]
                event = replace(event, kind=FailureKind.PEER_LOST)
                self._add_failure(_from_event(event))
                self._report(event)

    def _drain(self, proc: RankProcess) -> None:
        for event in proc.reader.read_available(max_bytes=1 << 30):
            self._handle(event)

    def on_rank_exit(self, proc: RankProcess) -> None:
        """A rank's process ended: read what is left, and decide whether that was a failure."""
        self._drain(proc)
        self.debug.rank_over(proc.rank)
        code = proc.returncode
        rank = proc.rank
        if rank in self.outcome.failures or rank in self.outcome.stopped or rank in self._peer_lost:
            return
        if code == 0 and rank in self.outcome.results:
            return
        if self.state in (SupervisorState.TERMINATING, SupervisorState.KILLED):
            self._mark_stopped(rank)
            return
        failure = self.death_failure(rank, code)
        self._add_failure(failure)
        self._report(
            Failure(
                rank=rank,
                exc_type=None,
                message=failure.message,
                traceback=failure.traceback,
                kind=failure.kind,
                exit_code=failure.exit_code,
                signal=failure.signal,
            )
        )

    def death_failure(self, rank: int, code: int | None) -> RankFailure:
        """A rank that ended without a result or a Python exception: what its exit code and logs say."""
        crash = clean_stacks(read_tail(crash_path(self.log_dir, rank), 200))
        log_tail = read_tail(log_path(self.log_dir, rank))
        details = ""
        if crash:
            details += f"Python stack when it crashed (faulthandler):\n{crash}\n"
        if log_tail:
            details += f"last output of rank {rank}:\n{log_tail}\n"
        if code is not None and code < 0:
            sig = -code
            killed = f"killed by {signal_name(sig)}"
            return RankFailure(
                rank, None, killed, details, exit_code=code, signal=sig, kind=FailureKind.SIGNAL
            )
        if code == 0:
            why = "it ended without returning a result (os._exit(0) or sys.exit inside the function?)"
        else:
            why = "the process ended abruptly (os._exit, or a fatal error in native code)"
        return RankFailure(rank, None, why, details, exit_code=code, kind=FailureKind.EXIT_CODE)

    # -- stopping -----------------------------------------------------------------------------
    def _signal_live(self, sig: int) -> None:
        for p in self.procs:
            if p.alive:
                p.signal_group(sig)

    def _enter(self, state: SupervisorState, now: float) -> None:
        self.state, self.state_since = state, now

    def _escalate(self, now: float) -> None:
        """After a first failure: SIGTERM the live ranks once the grace is over, then SIGKILL what is left."""
        if self.state is SupervisorState.FAILED and now - self.state_since >= FAILURE_GRACE_S:
            self._enter(SupervisorState.TERMINATING, now)
            self._signal_live(signal.SIGTERM)
        if self.state is SupervisorState.TERMINATING and now - self.state_since >= TERM_GRACE_S:
            self._enter(SupervisorState.KILLED, now)
            self._signal_live(signal.SIGKILL)

    def stop_all(self, grace: float = TERM_GRACE_S) -> list[int]:
        """SIGTERM every live rank, SIGKILL what is left after ``grace`` seconds; returns the ranks stopped."""
        live = [p for p in self.procs if p.alive]
        for p in live:
            p.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.alive for p in live):
            time.sleep(0.02)
        for p in live:
            if p.alive:
                p.signal_group(signal.SIGKILL)
        return [p.rank for p in live]

    # -- stacks: the hang watchdog and interrupts ---------------------------------------------
    def collect_stacks(self) -> dict[int, str]:
        """Every live rank's Python stacks (faulthandler, on ``STACKS_SIGNAL``), the launcher's frames removed."""
        live = [p for p in self.procs if p.alive]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, STACKS_SIGNAL)
        deadline = time.monotonic() + STACKS_WAIT_S
        stacks: dict[int, str] = {}
        while time.monotonic() < deadline:
            for p in live:
                text = read_tail(stacks_path(self.log_dir, p.rank), 400)
                if text:
                    stacks[p.rank] = text
            if len(stacks) == len(live):
                time.sleep(0.05)  # let faulthandler finish writing
                stacks = {p.rank: read_tail(stacks_path(self.log_dir, p.rank), 400) for p in live}
                stacks = {r: clean_stacks(t) or t for r, t in stacks.items()}
                break
            time.sleep(0.05)
        return stacks

    def _report_stacks(self, why: str) -> dict[int, str]:
        stacks = self.collect_stacks()
        for rank, text in sorted(stacks.items()):
            self._report(Stacks(rank=rank, text=text, reason=why))
        return stacks

    def _on_hang(self, idle: float) -> None:
        stacks = self._report_stacks("hang")
        stopped = self.stop_all()
        self.outcome.hung_after = idle
        blame, failures = hang_failures(stacks, stopped, idle)
        self.outcome.hang_blame = blame
        for failure in failures:
            self._add_failure(failure, stop_the_rest=False)  # stopped already
        for rank in blame.likely_cause:  # its row names it, not only the box below the rows
            self._report(Phase(rank=rank, phase=HUNG_CULPRIT))

    def _on_interrupt(self) -> None:
        """The user pressed stop: show where every rank was, then stop them all (a second stop is ignored)."""
        with contextlib.suppress(KeyboardInterrupt):
            self.outcome.interrupt_stacks = self._report_stacks("interrupt")
        while True:
            try:
                self.outcome.stopped = self.stop_all()
                return
            except KeyboardInterrupt:
                continue

    # -- the loop -----------------------------------------------------------------------------
    def _read_and_reap(self, sel: selectors.BaseSelector, waiting: dict[int, RankProcess]) -> None:
        """One pass: handle what the ranks sent, then take ranks that are over out of ``waiting``."""
        if sel.get_map():
            ready = sel.select(timeout=POLL_S)
        else:  # every pipe is closed: the ranks are exiting, and no fd will wake us when they are gone
            time.sleep(self._exit_wait)
            self._exit_wait = min(self._exit_wait * 2, POLL_S)
            ready = []
        for key, _ in ready:
            proc: RankProcess = key.data
            if key.fd == proc.exit_fd:  # the process ended (readable from now on): reaped below
                sel.unregister(key.fd)
                continue
            for event in proc.reader.read_available():
                self._handle(event)
            if proc.reader.eof:
                sel.unregister(key.fd)
        for rank, proc in list(waiting.items()):
            if proc.poll() is not None:
                self._exit_wait = EXIT_POLL_S
                del waiting[rank]
                for fd in (None if proc.reader.eof else proc.reader.fd, proc.exit_fd):
                    if fd is not None:
                        with contextlib.suppress(KeyError, ValueError):
                            sel.unregister(fd)
                self.on_rank_exit(proc)
            elif self._done_while_alive(rank):
                del waiting[rank]
        self.debug.serve(
            self._handle, self._tick
        )  # a rank's pdb prompt: the person's line (the others read meanwhile)
        if self.debug.active:  # time in the debugger is not a hang
            self._last_progress = time.monotonic()

    def _done_while_alive(self, rank: int) -> bool:
        """Whether ``rank`` is over although its process lives on (never, in a one-shot launch)."""
        return False

    def run(self) -> Outcome:
        """Supervise until every rank has ended; KeyboardInterrupt shows the stacks, stops every rank and propagates."""
        sel = selectors.DefaultSelector()
        for p in self.procs:
            sel.register(p.reader.fd, selectors.EVENT_READ, p)
            if p.exit_fd is not None:
                sel.register(p.exit_fd, selectors.EVENT_READ, p)
        try:
            waiting = {p.rank: p for p in self.procs}
            while waiting:
                self._read_and_reap(sel, waiting)
                now = time.monotonic()
                self._settle_peer_lost(now, final=not waiting)
                self._escalate(now)
                self._tick()
                if self.timeout is not None and waiting and not self.outcome.failures:
                    idle = now - self._last_progress
                    # a cold start (fresh interpreters importing torch) is not a hang
                    starting = any(r not in self._running for r in waiting)
                    limit = max(self.timeout, STARTUP_GRACE_S) if starting else self.timeout
                    if idle >= limit:
                        self._on_hang(idle)
            return self.outcome
        except KeyboardInterrupt:
            self._on_interrupt()
            raise
        finally:
            sel.close()
            self.debug.close()
            self.cleanup()

    def cleanup(self) -> None:
        """Nothing survives: kill what is left of every process group, reap, close the pipes."""
        for p in self.procs:
            if p.alive:
                p.signal_group(signal.SIGKILL)
        for p in self.procs:
            p.wait(5.0)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # grandchildren left in the rank's group
            p.close()
