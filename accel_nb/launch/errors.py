"""What went wrong in a launch: one ``RankFailure`` per failing rank, gathered in a ``LaunchError``.

try:
    notebook_launcher(train, num_processes=2)
except LaunchError as err:
    print(err.failures[0].rank, err.failures[0].kind, err.failures[0].exc_type)
"""

from __future__ import annotations

import linecache
import os
import types
from dataclasses import dataclass, field
from typing import Any

from .failures import FailureKind, describe, in_order
from .failures import signal_name as signal_name  # re-exported: the CLI imports it from here

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _machinery(frame: types.FrameType) -> bool:
    """A frame of accel_nb, or of IPython's magic dispatch (IPython 7 shows those: interactiveshell,
    the ``decorator`` package, magic.py; IPython 8+ hides them itself)."""
    filename = frame.f_code.co_filename
    if os.path.abspath(filename).startswith(_PACKAGE_DIR) or filename.startswith("<decorator-gen-"):
        return True
    module = str(frame.f_globals.get("__name__", ""))
    return module == "decorator" or module.startswith("IPython.core.")


def _magic_call(tb: types.TracebackType) -> bool:
    """A cell frame at IPython's rewrite of a magic (``get_ipython().run_cell_magic('accelerate', ...)``):
    the whole cell as one escaped string, nothing the user wrote."""
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_globals).strip()
    return line.startswith(("get_ipython().run_cell_magic(", "get_ipython().run_line_magic("))


def user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without accel_nb's own frames, IPython's magic dispatch nor a magic's rewritten call line
    (the user's cell and code stay, in order)."""
    kept = []
    outermost = True  # IPython's run_code: the shell's own tb_offset skips it, so it stays
    while tb is not None:
        if outermost or not (_machinery(tb.tb_frame) or _magic_call(tb)):
            kept.append(tb)
        outermost = False
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


class UserFramesOnly:
    """Mixin: in IPython, the error is shown with the user's frames only (the launcher's say nothing).

    IPython calls ``_render_traceback_`` when an exception defines it; elsewhere nothing changes.
    """

    def _render_traceback_(self) -> list[str]:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:  # pragma: no cover - IPython only calls this from a shell
            raise AttributeError("_render_traceback_")
        exc: Any = self
        return shell.InteractiveTB.structured_traceback(type(exc), exc, user_frames(exc.__traceback__))


@dataclass
class RankFailure:
    """How one rank failed (``kind``): a Python exception (``exc_type``), or a death with an exit code /
    signal, a hang... ``exc_type`` is ``None`` when no Python exception was raised."""

    rank: int
    exc_type: str | None
    message: str
    traceback: str = ""
    exit_code: int | None = None
    signal: int | None = None
    first: bool = False
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    kind: FailureKind = FailureKind.EXCEPTION

    def summary(self, first: bool = False) -> str:
        """One line: ``rank 1 failed: ValueError: boom`` or ``rank 0 died from SIGKILL: ...``
        (``first``: ``rank 1 (first to fail) failed: ...``)."""
        return describe(self, first=first)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.rstrip().splitlines())


class LaunchError(UserFramesOnly, RuntimeError):
    """A launch failed; ``.failures`` holds one ``RankFailure`` per failing rank (first failure first).

    except LaunchError as err:
        for f in err.failures:
            print(f.rank, f.kind, f.exc_type, f.message)
    """

    def __init__(
        self,
        failures: list[RankFailure],
        *,
        headline: str | None = None,
        stopped: list[int] | None = None,
        log_dir: str | None = None,
    ) -> None:
        self.failures = in_order(failures)
        self.headline = headline
        self.stopped = sorted(stopped or [])
        self.log_dir = log_dir
        super().__init__(self.report())

    @property
    def first(self) -> RankFailure | None:
        return self.failures[0] if self.failures else None

    def report(self) -> str:
        """The whole story in one readable block: who failed first, its traceback, who was stopped."""
        lines: list[str] = []
        first = self.first
        if self.headline:
            lines.append(self.headline)
        elif first is not None:
            lines.append(first.summary(first=True))
        else:
            lines.append("the launch failed")
        if first is not None and first.traceback:
            lines.append(f"--- rank {first.rank} traceback ---")
            lines.append(_indent(first.traceback))
        for other in self.failures[1:]:
            lines.append(other.summary())
            if other.traceback and other.kind is FailureKind.HANG:
                lines.append(_indent(other.traceback))
        if self.stopped:
            who = ", ".join(str(r) for r in self.stopped)
            lines.append(
                f"rank{'s' if len(self.stopped) > 1 else ''} {who} {'were' if len(self.stopped) > 1 else 'was'} stopped."
            )
        if self.log_dir:
            lines.append(f"full per-rank logs: {self.log_dir}")
        return "\n".join(lines)

    def __reduce__(self):  # picklable (e.g. when a launch runs inside another worker)
        return (_rebuild_launch_error, (self.failures, self.headline, self.stopped, self.log_dir))


def _rebuild_launch_error(failures, headline, stopped, log_dir):
    return LaunchError(failures, headline=headline, stopped=stopped, log_dir=log_dir)


class PayloadError(UserFramesOnly, TypeError):
    """The function, its arguments or a notebook name cannot be sent to the worker processes."""


class LaunchSetupError(UserFramesOnly, ValueError):
    """The launch cannot start as asked (busy port, unsupported mixed precision, bad option...)."""


class LaunchInterrupted(UserFramesOnly, KeyboardInterrupt):
    """The user stopped a launch: a ``KeyboardInterrupt`` (``except KeyboardInterrupt`` catches it) that
    IPython shows as a short summary, each rank's line, without the launcher's frames.

        except KeyboardInterrupt as stop:
            print(stop)   # "the launch was interrupted: every rank was stopped; rank 0 was at ..."
    """


# the notebook names it as what it is: a KeyboardInterrupt
LaunchInterrupted.__name__ = LaunchInterrupted.__qualname__ = "KeyboardInterrupt"
