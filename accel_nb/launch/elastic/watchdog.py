"""The hang watchdog of ``accel-nb launch --timeout``: the notebook face's diagnosis, for scripts.

torchrun's agent writes each rank's stdout and stderr to files under the log folder (``--tee``). A
thread here watches their sizes; when none grows for ``timeout`` seconds, it asks every rank of this
machine for its Python stacks (faulthandler, answered by ``accel_nb/launch/rank/script_main.py``, the
file each rank runs the script through), says what they show in the words of
``notebook_launcher(timeout=)`` (who waits in which collective, who is the likely cause, every
stack) and stops the agent with SIGTERM, as torchrun's own signal handling expects: the agent
stops its ranks and ``accel-nb launch`` exits with ``HANG_EXIT_CODE``.

    args += wrapped_command("train.py", ["--epochs", "3"], False, stacks_dir)
    watchdog = HangWatchdog(60, log_dir, stacks_dir, nproc=2)
    watchdog.start()
    ...                              # the agent runs in this thread
    if watchdog.settle():            # it fired: the ranks were stopped
        print(watchdog.report)
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable

import psutil

from ...env_names import ENV_LAUNCH_TIMEOUT
from ..errors import LaunchError
from ..parent.supervisor import STACKS_WAIT_S, STARTUP_GRACE_S, clean_stacks, hang_failures, hang_headline
from ..rank.terminal_pdb import rank_in_pdb
from ..rank.worker import STACKS_SIGNAL

__all__ = [
    "HANG_EXIT_CODE",
    "RANK_MAIN",
    "HangWatchdog",
    "launch_timeout",
    "wrapped_command",
]

HANG_EXIT_CODE = 124  # as coreutils' timeout: below 128 + N (a signal) and not 1 or 2
RANK_MAIN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "script_main.py"
)
POLL_S = 0.2  # how often the log files' sizes are read
BUSY_CPU_S = 0.05  # CPU seconds the ranks use between two polls that tell a starting rank from a stuck one
_ATTEMPT = re.compile(r"attempt_(\d+)$")


def launch_timeout(flag: float | None, environ: dict[str, str] | None = None) -> float | None:
    """``--timeout``, else ``ACCEL_NB_LAUNCH_TIMEOUT`` (seconds), else None; ValueError names a bad variable."""
    if flag is not None:
        return flag
    text = (os.environ if environ is None else environ).get(ENV_LAUNCH_TIMEOUT, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{ENV_LAUNCH_TIMEOUT}={text!r} is not a number of seconds above 0")
    return value


def wrapped_command(script: str, script_args: list[str], module: bool, stacks_dir: str) -> list[str]:
    """torchrun's arguments from the script on: each rank runs it through ``RANK_MAIN`` (``python -u``, as torchrun)."""
    python = os.getenv("PYTHON_EXEC", sys.executable)  # torchrun's own choice of interpreter
    kind = "module" if module else "file"
    return [
        "--no-python",
        python,
        "-u",
        RANK_MAIN,
        stacks_dir,
        str(int(STACKS_SIGNAL)),
        kind,
        script,
        *script_args,
    ]


def _sizes(log_dir: str) -> dict[str, int]:
    sizes = {}
    for path in glob.glob(os.path.join(log_dir, "*", "attempt_*", "*", "std*.log")):
        with contextlib.suppress(OSError):
            sizes[path] = os.path.getsize(path)
    return sizes


def _cpu_seconds(pids: Iterable[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def _every_rank_spoke(sizes: dict[str, int], nproc: int) -> bool:
    """Whether each local rank of the newest attempt has written some output (its start is behind it)."""
    attempts: dict[str, dict[int, int]] = {}
    for path, size in sizes.items():
        rank_dir = os.path.dirname(path)
        attempt = os.path.dirname(rank_dir)
        with contextlib.suppress(ValueError):
            per_rank = attempts.setdefault(attempt, {})
            local = int(os.path.basename(rank_dir))
            per_rank[local] = per_rank.get(local, 0) + size
    if not attempts:
        return False
    newest = max(attempts, key=lambda a: int(m[1]) if (m := _ATTEMPT.search(a)) else -1)
    return all(attempts[newest].get(r, 0) > 0 for r in range(nproc))


class HangWatchdog:
    """Watch the ranks' output; after ``timeout`` s without any, show every rank's stacks and stop the agent."""

    exit_code = HANG_EXIT_CODE

    def __init__(self, timeout: float, log_dir: str, stacks_dir: str, nproc: int) -> None:
        self.timeout = timeout
        self.log_dir = log_dir
        self.stacks_dir = stacks_dir
        self.nproc = nproc
        self.fired = False
        self.report: str | None = None  # the diagnosis, once it fired
        self._procs: dict[int, psutil.Process | bool] = {}  # pid -> its process, False: not a rank of ours
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="accel_nb-hang-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def settle(self) -> bool:
        """Stop watching; whether it fired. Its SIGTERM to this process is taken here, never later."""
        from torch.distributed.elastic.multiprocessing.api import SignalException  # deferred: import time

        try:
            with self._lock:
                self._closed.set()
            if self._thread.is_alive():
                self._thread.join()
            _checkpoint()  # a Python call: a pending signal handler runs at its start
        except SignalException:
            pass
        return self.fired

    # -- the thread ---------------------------------------------------------------------------
    def _watch(self) -> None:
        seen: dict[str, int] = {}
        last_output = last_busy = time.monotonic()
        cpu = 0.0
        while not self._closed.wait(POLL_S):
            sizes = _sizes(self.log_dir)
            now = time.monotonic()
            if sizes != seen:
                seen, last_output = sizes, now
            if rank_in_pdb():  # a person at a rank's breakpoint (terminal_pdb): not a hang
                last_output = now
            starting = not _every_rank_spoke(sizes, self.nproc)
            if starting:
                # a cold start is not a hang: until every rank has written something, ranks that work
                # (import torch, start CUDA: use CPU) have up to STARTUP_GRACE_S
                used, cpu = cpu, _cpu_seconds(self.rank_pids().values())
                if cpu - used > BUSY_CPU_S:
                    last_busy = now
            idle = now - last_output
            if idle < self.timeout or (
                starting and now - last_busy < self.timeout and idle < max(self.timeout, STARTUP_GRACE_S)
            ):
                continue
            ranks = self.rank_pids()
            if not ranks:  # no rank runs here (yet, or any more): nothing hangs
                last_output = now
                continue
            try:
                self._on_hang(idle, ranks)
            except Exception as exc:  # noqa: BLE001 - the launch goes on without a watchdog, said once
                print(f"[accel_nb] the hang watchdog failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return

    def rank_pids(self) -> dict[int, int]:
        """{global rank: pid} of the live ranks this process started (each left its pid when it began)."""
        pids = {}
        for path in glob.glob(os.path.join(self.stacks_dir, "rank_*.pid")):
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                with open(path) as f:
                    pid = int(f.read().strip())
                proc = self._procs.get(pid)
                if proc is None:  # once per pid: is it a descendant of this process (not a stale pid)?
                    proc = psutil.Process(pid)
                    self._procs[pid] = proc if os.getpid() in {p.pid for p in proc.parents()} else False
                if proc and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    pids[int(os.path.basename(path)[len("rank_") : -len(".pid")])] = pid
        return pids

    def collect_stacks(self, ranks: dict[int, int]) -> dict[int, str]:
        """Every rank's Python stacks (faulthandler, on the stacks signal), the launcher's frames removed."""
        for pid in ranks.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, STACKS_SIGNAL)
        paths = {r: os.path.join(self.stacks_dir, f"rank_{r}.stacks") for r in ranks}
        deadline = time.monotonic() + STACKS_WAIT_S
        while time.monotonic() < deadline and not all(_read(p) for p in paths.values()):
            time.sleep(0.05)
        time.sleep(0.05)  # let faulthandler finish writing
        stacks = {r: _read(p) for r, p in paths.items()}
        return {r: clean_stacks(t) or t for r, t in stacks.items() if t}

    def _on_hang(self, idle: float, ranks: dict[int, int]) -> None:
        stacks = self.collect_stacks(ranks)
        blame, failures = hang_failures(stacks, sorted(ranks), idle)
        failures[0].first = True  # the likely cause, as the notebook face's first to fail
        error = LaunchError(failures, headline=hang_headline(idle, self.timeout, blame), log_dir=self.log_dir)
        with self._lock:
            if self._closed.is_set():  # the agent is over: nothing to stop
                return
            self.report = error.report()
            self.fired = True
            os.kill(os.getpid(), signal.SIGTERM)  # torchrun's handler: the agent stops every rank and raises


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _checkpoint() -> None:
    """Nothing: calling it lets the interpreter run a pending signal handler (``HangWatchdog.settle``)."""
