"""What ``accel-nb launch`` says when ranks fail: the first real failure, its exception line, its log.

torchrun's agent reports every failed rank; a rank that only saw a peer vanish (a broken
connection, or the agent's SIGTERM) is a symptom, so it is listed after the cause. How the first
failure is worded comes from ``launch/failures.py``, as for every other launch.

    print(failure_summary(exc.failures, "train.py", log_dir))
"""

from __future__ import annotations

import glob
import os
import re
import signal
from typing import Any

from ..errors import RankFailure
from ..failures import FailureKind, first_failure_line

__all__ = ["order_failures", "failure_summary"]

PROG = "accel-nb"


_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)|[A-Z]\w+Error)\b:?.*")


def _rank_log(log_dir: str, local_rank: int, stream: str = "stderr") -> str | None:
    found = sorted(
        glob.glob(os.path.join(log_dir, "*", "attempt_*", str(local_rank), f"{stream}.log")),
        key=os.path.getmtime,
    )
    return found[-1] if found else None


def _log_tail(log_path: str | None, count: int = 60) -> list[str]:
    if not log_path:
        return []
    try:
        with open(log_path, errors="replace") as f:
            lines = [_PREFIX.sub("", line.rstrip()) for line in f]
    except OSError:
        return []
    return lines[-count:]


def _exception_line(lines: list[str]) -> str | None:
    """The last line of ``lines`` that reads like a Python exception (``ValueError: ...``)."""
    for line in reversed(lines):
        if _EXC_LINE.match(line):
            return line.strip()
    return None


def _last_exception(log_path: str | None) -> str | None:
    return _exception_line(_log_tail(log_path))


def ended(rank: int, exitcode: int) -> RankFailure:
    """torchrun's record of a failed rank's exit (negative: killed by that signal) in the failure model."""
    killed = exitcode < 0
    return RankFailure(
        rank,
        None,
        "",
        exit_code=exitcode,
        signal=-exitcode if killed else None,
        kind=FailureKind.SIGNAL if killed else FailureKind.EXIT_CODE,
    )


_SYMPTOMS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
)


def order_failures(failures: dict[int, Any], log_dir: str) -> list[tuple[int, Any]]:
    """Failing ranks, the cause first: ranks that only saw a peer vanish come after the rest,
    then by failure time (torch records whole seconds) and by when each rank last wrote its log."""

    def key(item: tuple[int, Any]) -> tuple[int, float, int, float, int]:
        rank, failure = item
        log = _rank_log(log_dir, failure.local_rank)
        tail = _log_tail(log)  # read once: the exception line and the symptoms come from it
        exc = _exception_line(tail) or ""
        # the agent stops the survivors with SIGTERM; a peer's death shows as a broken connection,
        # raised as an exception or printed by C++ ("terminate called ... Connection closed by peer")
        symptom = failure.exitcode == -signal.SIGTERM or any(s in line for line in tail for s in _SYMPTOMS)
        # in the same second, a rank that raised comes before one that died without a Python
        # exception (gloo's threads abort a rank whose peer vanished: SIGABRT, nothing in its log)
        bare_signal = failure.exitcode < 0 and not exc
        mtime = os.path.getmtime(log) if log else float("inf")
        return (int(symptom), float(failure.timestamp), int(bare_signal), mtime, rank)

    return sorted(failures.items(), key=key)


def failure_summary(failures: dict[int, Any], script: str, log_dir: str) -> str:
    """A few lines: which rank failed first, how, the last exception line, and where its log is."""
    ordered = order_failures(failures, log_dir)
    rank, first = ordered[0]
    log = _rank_log(log_dir, first.local_rank)
    lines = [f"{PROG} launch: " + first_failure_line(ended(rank, first.exitcode), _last_exception(log))]
    lines.append(f"  script: {script}")
    if log:
        lines.append(f"  its log: {log} (stdout.log next to it)")
    others = [r for r, _ in ordered[1:]]
    if others:
        lines.append(f"  also failed: rank(s) {', '.join(map(str, others))}")
    lines.append(f"  the other ranks were stopped; every rank's log is under {log_dir}")
    return "\n".join(lines)
