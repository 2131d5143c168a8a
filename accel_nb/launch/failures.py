"""The failure model of a launch: how a rank failed (a ``FailureKind``), in words, and who failed first.

Every reporter (text, widget), ``LaunchError`` and the session word a failure with :func:`describe`
and learn who failed first from :class:`FirstToFail` / :func:`first_failure`; ``accel-nb launch``
(torchrun's ranks) words its summary line with :func:`first_failure_line`. So a change of wording
is made here once.

    describe(RankFailure(1, None, "the process ended abruptly", kind=FailureKind.EXIT_CODE, exit_code=3))
    # 'rank 1 exited with code 3 without a Python exception: the process ended abruptly'
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Iterable
from typing import Literal, Protocol, TypeVar

from ..events import FailureKind
from ..progress_format import one_line

__all__ = [
    "FailureKind",
    "FailureLike",
    "FirstToFail",
    "describe",
    "first_failure",
    "first_failure_line",
    "in_order",
    "lost_a_peer",
    "signal_cause",
    "signal_name",
]


class FailureLike(Protocol):
    """What :func:`describe` reads: an ``events.Failure`` or a ``RankFailure``."""

    rank: int
    kind: FailureKind
    exc_type: str | None
    message: str
    exit_code: int | None
    signal: int | None


# signal number -> what it most likely means for a training process
_SIGNAL_CAUSES: dict[int, str] = {
    _signal.SIGKILL: "likely out of memory (the kernel's OOM killer) or killed from outside with kill -9",
    _signal.SIGSEGV: "a crash in native code (segmentation fault in a C/C++/CUDA extension)",
    _signal.SIGABRT: "aborted by native code (a failed C++ assertion or an uncaught C++ exception)",
    _signal.SIGBUS: "a bus error in native code (often a full /dev/shm or a truncated memory-mapped file)",
    _signal.SIGFPE: "an arithmetic fault in native code",
    _signal.SIGILL: "an illegal instruction in native code (a binary built for another CPU)",
    _signal.SIGTERM: "terminated from outside (SIGTERM)",
    _signal.SIGINT: "interrupted (SIGINT)",
}


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"``."""
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_cause(signum: int) -> str:
    """A short human explanation of why a process may have died from ``signum``."""
    return _SIGNAL_CAUSES.get(signum, "killed by a signal")


# gloo / NCCL / TCPStore words for "the other side went away": a rank failing with these after a
# peer died was stopped by that death, it did not fail on its own
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|failed to recv, got 0 bytes"
    r"|remote process exited|NCCL communicator was aborted|Connection refused",
    re.IGNORECASE,
)


def lost_a_peer(failure: FailureLike) -> bool:
    """True when ``failure`` reads like a collective that broke because another rank went away."""
    return bool(_PEER_LOST.search(f"{failure.exc_type}: {failure.message}"))


def _verb_and_detail(f: FailureLike) -> tuple[str, str, str]:
    """(what the rank did, what follows it, a one-word label) for each kind."""
    kind = f.kind
    if kind is FailureKind.EXIT_CODE:
        code = f.exit_code
        return f"exited with code {code} without a Python exception", f.message, f"exit code {code}"
    if kind is FailureKind.SIGNAL:
        name = signal_name(f.signal) if f.signal is not None else "a signal"
        cause = signal_cause(f.signal) if f.signal is not None else f.message
        return f"died from {name}", cause, name
    if kind is FailureKind.HANG:
        return "hung", f.message, "hung"
    if kind is FailureKind.STUCK:
        return "was stuck", f.message, "stuck"
    if kind is FailureKind.INTERRUPTED:
        return "stopped", str(f.exc_type or "interrupted"), str(f.exc_type or "interrupted")
    # an exception (a lost peer raises one too)
    return "failed", f"{f.exc_type}: {f.message}", str(f.exc_type)


def describe(
    failure: FailureLike,
    *,
    who: str | None = None,
    first: bool = False,
    form: Literal["sentence", "detail", "label"] = "sentence",
    brief: bool = False,
) -> str:
    """How a rank failed, in words: the one place that words a failure.

    ``form``: ``"sentence"`` (``rank 1 failed: ValueError: boom``, ``rank 1 exited with code 3
    without a Python exception: ...``, ``rank 0 died from SIGKILL: likely out of memory ...``);
    ``"detail"``, what follows a status that already says "failed" (``ValueError: boom``,
    ``exited with code 3 without a Python exception: ...``); ``"label"``, one word or two
    (``ValueError``, ``exit code 3``, ``SIGKILL``). ``who`` names the rank (``"rank 1"`` unless
    given; ``""`` for none); ``first`` adds "(first to fail)" after it; ``brief`` keeps the first
    line of the detail only (cut to 200 characters).

    describe(failure, first=True)    # 'rank 1 (first to fail) failed: ValueError: boom'
    """
    verb, detail, label = _verb_and_detail(failure)
    if form == "label":
        return label
    if brief:
        detail = one_line(detail)
    if form == "detail":
        return detail if verb == "failed" else f"{verb}: {detail}"
    subject = f"rank {failure.rank}" if who is None else who
    if first:
        subject += " (first to fail)"
    return f"{subject} {verb}: {detail}" if subject else f"{verb}: {detail}"


def process_end(failure: FailureLike, *, after_exception: bool = False) -> str:
    """How a failed rank's process ended, as ``accel-nb launch`` says it after torchrun reported it.

    ``exited with code 1``, ``was killed by SIGKILL (likely out of memory ...)``; after the rank's
    own exception line (``after_exception``), a signal reads ``then the process got SIGKILL (...)``.
    """
    if failure.kind is FailureKind.SIGNAL and failure.signal is not None:
        name, cause = signal_name(failure.signal), signal_cause(failure.signal)
        return (
            f"then the process got {name} ({cause})" if after_exception else f"was killed by {name} ({cause})"
        )
    return f"exited with code {failure.exit_code}"


def first_failure_line(failure: FailureLike, exception_line: str | None) -> str:
    """``accel-nb launch``'s line for the first failing rank: its last exception line (from its log), then how it ended.

    first_failure_line(failure, "ValueError: boom")  # 'rank 1 failed first: ValueError: boom (exited with code 1)'
    first_failure_line(killed, None)                 # 'rank 0 failed first: was killed by SIGKILL (likely ...)'
    """
    if exception_line:
        return f"rank {failure.rank} failed first: {exception_line} ({process_end(failure, after_exception=True)})"
    return f"rank {failure.rank} failed first: {process_end(failure)}"


class FirstToFail:
    """Who failed first: the first rank whose failure was recorded — the one rule, kept by the
    supervisor (which records failures in the order it decides them) and by each reporter (which
    sees the failures in that same order).

    order = FirstToFail()
    order.record(1), order.record(0)   # (True, False); order.rank == 1
    """

    def __init__(self) -> None:
        self.rank: int | None = None

    def record(self, rank: int) -> bool:
        """Note that ``rank`` failed; True when it is the first to fail."""
        if self.rank is None:
            self.rank = rank
        return self.rank == rank


class _Ranked(Protocol):
    rank: int
    first: bool


R = TypeVar("R", bound=_Ranked)


def first_failure(failures: Iterable[R]) -> R | None:
    """The failure marked first to fail; with none marked, the lowest rank's (``None`` when there is none)."""
    ordered = in_order(failures)
    return ordered[0] if ordered else None


def in_order(failures: Iterable[R]) -> list[R]:
    """``failures`` with the first to fail first, the others by rank."""
    return sorted(failures, key=lambda f: (not f.first, f.rank))
