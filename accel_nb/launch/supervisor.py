"""Start the ranks and watch them: events, liveness, failures, interrupt, hang watchdog, clean-up.

The supervisor loop runs in the thread that called the launcher (in Jupyter: the cell's own
thread), so everything the reporter prints lands in the launching cell.

    procs = start_ranks(plan, payload, log_dir, payload_path)
    outcome = Supervisor(procs, reporter, timeout=60).run()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..events import Event, Failure, Heartbeat, Phase, Result, Stacks
from . import zygote
from .channel import EventReader
from .errors import RankFailure, signal_name
from .plan import LaunchPlan
from .worker import STACKS_SIGNAL, RankSpec, crash_path, fork_main, log_path, stacks_path

STARTUP_GRACE_S = 120.0  # the watchdog allows at least this long until every rank runs the payload
FAILURE_GRACE_S = 0.5  # after a first failure, let the others report their own errors this long
TERM_GRACE_S = 2.0  # SIGTERM -> SIGKILL
STACKS_WAIT_S = 1.0  # how long the watchdog waits for faulthandler to write the stacks

_live: weakref.WeakSet[RankProcess] = weakref.WeakSet()
_live_lock = threading.Lock()


class RankProcess:
    """One started rank: its pid (also its process group), its event reader, its exit status."""

    def __init__(
        self,
        rank: int,
        pid: int,
        reader: EventReader,
        popen: subprocess.Popen | None = None,
        server: Any = None,
    ) -> None:
        self.rank = rank
        self.pid = pid
        self.reader = reader
        self.popen = popen
        self.server = server  # the spawn server that forked this rank (it reaps it and reports the exit)
        self.returncode: int | None = None
        with _live_lock:
            _live.add(self)

    def poll(self) -> int | None:
        if self.returncode is None:
            if self.server is not None:
                self.returncode = self.server.returncode(self.pid)
            elif self.popen is not None:
                self.returncode = self.popen.poll()
            else:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:
                    self.returncode = -255
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
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
        with _live_lock:
            _live.discard(self)


def _kill_all_at_exit() -> None:  # the kernel is going away: take every rank with it
    with _live_lock:
        procs = list(_live)
    for p in procs:
        p.signal_group(signal.SIGKILL)


atexit.register(_kill_all_at_exit)


# ---------------------------------------------------------------------------- start
def start_fork(plan: LaunchPlan, payload: Any, log_dir: str, procs: list[RankProcess]) -> list[RankProcess]:
    """Fork one child per rank into ``procs``; each runs ``fork_main`` with the payload already in its memory."""
    parent_pid = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
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
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(r)
                for other in procs:
                    with contextlib.suppress(OSError):
                        os.close(other.reader.fd)
                os.setpgid(0, 0)
            except BaseException:  # noqa: BLE001
                pass
            fork_main(spec, payload)  # never returns
        os.close(w)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # both sides set it: no race with an early killpg
        procs.append(RankProcess(rank, pid, EventReader(r, rank)))
    return procs


def start_spawn(
    plan: LaunchPlan, log_dir: str, payload_path: str, procs: list[RankProcess]
) -> list[RankProcess]:
    """Start one fresh interpreter per rank into ``procs``; each loads the cloudpickled payload from ``payload_path``."""
    import accel_nb

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(accel_nb.__file__)))
    spec_file = os.path.join(log_dir, "spec.json")
    base = RankSpec(
        0, plan.num_processes, log_dir, -1, os.getpid(), False, {}, list(sys.path), os.getcwd(), payload_path
    )
    with open(spec_file, "w") as f:
        f.write(base.to_json())
    code = "from accel_nb.launch.worker import spawn_main; spawn_main()"
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
        for rank in range(plan.num_processes):
            r, w = os.pipe()
            env = dict(os.environ)
            env.update(plan.rank_env(rank))
            log_fd = os.open(log_path(log_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                pid = server.start_rank(spec_file, rank, env, w, log_fd)
            except BaseException:
                os.close(r)
                raise
            finally:
                os.close(w)
                os.close(log_fd)
            procs.append(RankProcess(rank, pid, EventReader(r, rank), server=server))
        return procs
    for rank in range(plan.num_processes):
        r, w = os.pipe()
        env = dict(os.environ)
        env.update(plan.rank_env(rank))
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            with open(log_path(log_dir, rank), "ab") as early_log:  # output before the capture starts
                popen = subprocess.Popen(
                    [sys.executable, "-c", code, spec_file, str(rank), str(w)],
                    pass_fds=(w,),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=early_log,
                    stderr=early_log,
                    start_new_session=True,  # its own process group (killpg), Python 3.10 too
                )
        finally:
            os.close(w)
        procs.append(RankProcess(rank, popen.pid, EventReader(r, rank), popen))
    return procs


# ---------------------------------------------------------------------------- supervise
@dataclass
class Outcome:
    """What the supervisor saw: results by rank, failures, who it stopped, whether it was a hang."""

    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    stopped: list[int] = field(default_factory=list)
    hung_after: float | None = None
    interrupted: bool = False


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


_LAUNCH_DIR = os.path.dirname(os.path.abspath(__file__))
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


class Supervisor:
    """Feed events to the reporter, decide when ranks failed, stop the rest, watch for hangs."""

    def __init__(
        self, procs: list[RankProcess], reporter: Any, log_dir: str, timeout: float | None = None
    ) -> None:
        self.procs = procs
        self.reporter = reporter
        self.log_dir = log_dir
        self.timeout = timeout
        self.outcome = Outcome()
        self._first_failure_at: float | None = None
        self._term_sent_at: float | None = None
        self._killed = False
        self._last_progress = time.monotonic()
        self._running: set[int] = set()  # ranks that reached the payload (startup is over for them)

    # -- events -------------------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        if not isinstance(event, Heartbeat):
            self._last_progress = time.monotonic()
        if isinstance(event, Phase) and event.phase == "running":
            self._running.add(event.rank)
        if isinstance(event, Result):
            self.outcome.results[event.rank] = event.value
        elif isinstance(event, Failure):
            if event.rank not in self.outcome.failures:
                self._add_failure(
                    RankFailure(
                        event.rank, event.exc_type, event.message, event.traceback, exception=event.exception
                    )
                )
        self._report(event)

    def _report(self, event: Event) -> None:
        try:
            self.reporter.handle(event)
        except Exception as exc:  # noqa: BLE001 - a broken display must not break the launch
            print(f"[accel_nb] the reporter failed on {type(event).__name__}: {exc}", file=sys.stderr)

    def _add_failure(self, failure: RankFailure) -> None:
        if not self.outcome.failures:
            failure.first = True
            self._first_failure_at = time.monotonic()
        self.outcome.failures[failure.rank] = failure

    def _drain(self, proc: RankProcess) -> None:
        for event in proc.reader.read_available(max_bytes=1 << 30):
            self._handle(event)

    def _on_exit(self, proc: RankProcess) -> None:
        """A rank's process ended: read what is left, and decide whether that was a failure."""
        self._drain(proc)
        code = proc.returncode
        rank = proc.rank
        if rank in self.outcome.failures or rank in self.outcome.stopped:
            return
        if code == 0 and rank in self.outcome.results:
            return
        if self._term_sent_at is not None:
            self.outcome.stopped.append(rank)
            return
        crash = clean_stacks(_tail(crash_path(self.log_dir, rank), 200))
        log_tail = _tail(log_path(self.log_dir, rank))
        details = ""
        if crash:
            details += f"Python stack when it crashed (faulthandler):\n{crash}\n"
        if log_tail:
            details += f"last output of rank {rank}:\n{log_tail}\n"
        if code is not None and code < 0:
            sig = -code
            failure = RankFailure(
                rank, signal_name(sig), f"killed by {signal_name(sig)}", details, exit_code=code, signal=sig
            )
        elif code == 0:
            failure = RankFailure(
                rank,
                "ExitCode",
                "it ended without returning a result (os._exit(0) or sys.exit inside the function?)",
                details,
                exit_code=0,
            )
        else:
            failure = RankFailure(
                rank,
                "ExitCode",
                "the process ended abruptly (os._exit, or a fatal error in native code)",
                details,
                exit_code=code,
            )
        self._add_failure(failure)
        self._report(
            Failure(rank=rank, exc_type=failure.exc_type, message=failure.summary(), traceback=details)
        )

    # -- stopping -----------------------------------------------------------------------------
    def _signal_live(self, sig: int) -> None:
        for p in self.procs:
            if p.alive:
                p.signal_group(sig)

    def _escalate(self, now: float) -> None:
        if (
            self._first_failure_at is not None
            and self._term_sent_at is None
            and now - self._first_failure_at >= FAILURE_GRACE_S
        ):
            self._term_sent_at = now
            self._signal_live(signal.SIGTERM)
        if self._term_sent_at is not None and not self._killed and now - self._term_sent_at >= TERM_GRACE_S:
            self._killed = True
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

    # -- hang watchdog ------------------------------------------------------------------------
    def _collect_stacks(self) -> dict[int, str]:
        live = [p for p in self.procs if p.alive]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, STACKS_SIGNAL)
        deadline = time.monotonic() + STACKS_WAIT_S
        stacks: dict[int, str] = {}
        while time.monotonic() < deadline:
            for p in live:
                text = _tail(stacks_path(self.log_dir, p.rank), 400)
                if text:
                    stacks[p.rank] = text
            if len(stacks) == len(live):
                time.sleep(0.05)  # let faulthandler finish writing
                stacks = {p.rank: _tail(stacks_path(self.log_dir, p.rank), 400) for p in live}
                stacks = {r: clean_stacks(t) or t for r, t in stacks.items()}
                break
            time.sleep(0.05)
        return stacks

    def _on_hang(self, idle: float) -> None:
        stacks = self._collect_stacks()
        for rank, text in sorted(stacks.items()):
            self._report(Stacks(rank=rank, text=text))
        stopped = self.stop_all()
        self.outcome.hung_after = idle
        for rank in stopped:
            text = stacks.get(rank, "(no stack: the rank did not answer)")
            self.outcome.failures[rank] = RankFailure(
                rank,
                "Hang",
                f"no progress for {idle:.0f} s; it was stopped",
                f"Python stacks of rank {rank}:\n{text}",
                first=not self.outcome.failures,
            )

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Supervise until every rank has ended; KeyboardInterrupt stops them all and propagates."""
        sel = selectors.DefaultSelector()
        for p in self.procs:
            sel.register(p.reader.fd, selectors.EVENT_READ, p)
        try:
            waiting = {p.rank: p for p in self.procs}
            while waiting:
                for key, _ in sel.select(timeout=0.05):
                    proc: RankProcess = key.data
                    for event in proc.reader.read_available():
                        self._handle(event)
                    if proc.reader.eof:
                        sel.unregister(key.fd)
                for rank, proc in list(waiting.items()):
                    if proc.poll() is not None:
                        del waiting[rank]
                        if not proc.reader.eof:
                            with contextlib.suppress(KeyError, ValueError):
                                sel.unregister(proc.reader.fd)
                        self._on_exit(proc)
                now = time.monotonic()
                self._escalate(now)
                if self.timeout is not None and waiting and not self.outcome.failures:
                    idle = now - self._last_progress
                    # a cold start (fresh interpreters importing torch) is not a hang
                    starting = any(r not in self._running for r in waiting)
                    limit = max(self.timeout, STARTUP_GRACE_S) if starting else self.timeout
                    if idle >= limit:
                        self._on_hang(idle)
            return self.outcome
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            self.outcome.stopped = self._stop_ignoring_interrupts()
            raise
        finally:
            sel.close()
            self.cleanup()

    def _stop_ignoring_interrupts(self) -> list[int]:
        while True:
            try:
                return self.stop_all()
            except KeyboardInterrupt:
                continue

    def cleanup(self) -> None:
        """Nothing survives: kill what is left of every process group, reap, close the pipes."""
        for p in self.procs:
            if p.alive:
                p.signal_group(signal.SIGKILL)
        for p in self.procs:
            deadline = time.monotonic() + 5
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # grandchildren left in the rank's group
            p.close()
