"""Reporters turn a launch's events into something to look at: text lines, or a list (tests).

A reporter gets ``start``, ``handle(event)`` for every event, ``finish``, and — when it has a
``tick()`` method — a call from the supervisor's loop a few times a second, so what it shows
moves on even while no event arrives (a rank stuck in a collective sends only heartbeats).

    rep = TextReporter(show_ranks=0)        # only rank 0's output; failures of any rank always shown
    notebook_launcher(fn, num_processes=2, reporter=rep)
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from ...events import (
    Dropped,
    Event,
    Failure,
    Heartbeat,
    Log,
    Metrics,
    Phase,
    Progress,
    Reporter,
    Result,
    Role,
    Stacks,
)
from ...progress_format import format_metrics, format_progress_line, one_line
from ..failures import describe
from ..options import parse_show_ranks
from .launch_progress import STALL_AFTER, LaunchProgress
from .output_lines import MERGE_WINDOW_S, OutputRelay

STALL_CHECK_S = 0.5  # how often ``tick`` looks for ranks that went quiet


class TextReporter(Reporter):
    """Rank-prefixed whole lines; progress at most once per ``progress_interval`` s per loop (plus the last).

    Identical lines from several ranks are printed once (``[ranks 0,1] ...``); a rank silent for
    ``stall_after`` seconds gets a "no progress for N s" line, repeated as the silence doubles.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        err_stream: TextIO | None = None,
        show_ranks: Any = "all",
        progress_interval: float = 1.0,
        stall_after: float = STALL_AFTER,
        merge_window: float = MERGE_WINDOW_S,
    ) -> None:
        self._stream = stream
        self._err_stream = err_stream
        self.show = parse_show_ranks(show_ranks)
        self.progress_interval = progress_interval
        self.stall_after = stall_after
        self.merge_window = merge_window
        self.num_processes = 0
        self.info: dict[str, Any] = {}
        self._last_progress: dict[tuple[int, str], float] = {}
        self._lock = threading.Lock()
        self._failure_shown = False
        self.start(1, {})

    # streams are looked up at write time: in Jupyter they belong to the cell running now
    @property
    def out(self) -> TextIO:
        return self._stream or sys.stdout

    @property
    def err(self) -> TextIO:
        return self._err_stream or self._stream or sys.stderr

    def shown(self, rank: int) -> bool:
        return self.show is None or rank in self.show

    def start(self, num_processes: int, info: dict[str, Any]) -> None:
        self._failure_shown = False
        self.num_processes = num_processes
        self.info = dict(info)
        self.state = LaunchProgress(num_processes, self.stall_after)
        self.relay = OutputRelay(num_processes, self.show, self.merge_window, self._stream, self._err_stream)
        self._last_progress.clear()
        self._roles_said: dict[int, str] = {}  # rank -> the role line last written
        self._next_quiet_note: dict[int, float] = {}  # rank -> silence (s) at which to say so next
        self._last_stall_check = 0.0

    def _write(self, stream: TextIO, text: str) -> None:
        with self._lock:
            stream.write(text)
            stream.flush()

    def handle(self, event: Event) -> None:
        rank = event.rank
        self.state.apply(event)
        if isinstance(event, (Log, Dropped)):
            self.relay.add(event)
        elif isinstance(event, Progress):
            if not self.shown(rank):
                return
            key = (rank, event.name)
            now = time.monotonic()
            final = event.done or (event.total is not None and event.n >= event.total)
            if not final and now - self._last_progress.get(key, -1e9) < self.progress_interval:
                return
            self._last_progress[key] = now
            line = format_progress_line(
                event.n, event.total, event.rate, event.metrics, event.desc or event.name
            )
            self.relay.add_line(rank, "stdout", f"[rank {rank}] {line}")  # in order with the rank's output
        elif isinstance(event, Metrics):
            if not self.shown(rank):
                return
            key = (rank, "\0metrics")
            now = time.monotonic()
            if now - self._last_progress.get(key, -1e9) < self.progress_interval:
                return
            self._last_progress[key] = now
            step = f"step {event.step}: " if event.step is not None else ""
            self.relay.add_line(rank, "stdout", f"[rank {rank}] {step}{format_metrics(event.values)}")
        elif isinstance(event, Failure):
            # one line, after what the rank printed before it; the traceback is shown once, in the
            # LaunchError the cell raises
            self._failure_shown = True
            then = ", stopping the other ranks" if self.state.first_failure == rank else ""
            line = describe(event, who=f"[rank {rank}]", brief=True) + then
            self.relay.add_line(rank, "stderr", line)
        elif isinstance(event, Role):
            text = event.text()
            # "[rank 3] role: dp 1 · tp 1", in order with its output; said again only when it changes
            if text and not event.again and self.shown(rank) and self._roles_said.get(rank) != text:
                self._roles_said[rank] = text
                self.relay.add_line(rank, "stdout", f"[rank {rank}] role: {text}")
        elif isinstance(event, Stacks):
            why = "when stopped" if getattr(event, "reason", "hang") == "interrupt" else "hang watchdog"
            text = f"[rank {rank}] Python stacks ({why}):\n" + "".join(
                f"[rank {rank}]   {line}\n" for line in event.text.splitlines()
            )
            self.relay.flush()  # what the ranks printed before they were stopped comes first
            self._write(self.err, text)
        elif isinstance(event, Heartbeat):
            self.tick()
        elif isinstance(event, (Phase, Result)):
            return

    def tick(self) -> None:
        """Write merged lines whose wait is over; say which ranks went quiet (called by the supervisor)."""
        now = time.monotonic()
        self.relay.tick(now)
        if now - self._last_stall_check < STALL_CHECK_S:
            return
        self._last_stall_check = now
        for rank, view in self.state.ranks.items():
            quiet = view.quiet_for(now)
            if view.finished or view.failed or not self.shown(rank) or quiet < self.stall_after:
                self._next_quiet_note.pop(rank, None)
                continue
            if quiet >= self._next_quiet_note.get(rank, self.stall_after):
                self._next_quiet_note[rank] = 2 * quiet  # again when the silence has doubled
                self._write(self.err, f"[rank {rank}] {self.state.rank_line(rank, now, label=False)}\n")

    def finish(self, ok: bool, summary: str | None = None) -> None:
        self.relay.finish()
        self.state.finish(ok)
        if not ok and summary and not self._failure_shown:
            log_dir = self.info.get("log_dir")
            where = f" (full logs: {log_dir})" if log_dir else ""
            self._write(self.err, f"[accel_nb] {one_line(summary)}{where}\n")


class ListReporter(Reporter):
    """Keeps every event (and start/finish calls) in memory, for tests and programmatic use."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.started: tuple[int, dict[str, Any]] | None = None
        self.finished: tuple[bool, str | None] | None = None

    def start(self, num_processes: int, info: dict[str, Any]) -> None:
        self.started = (num_processes, dict(info))

    def handle(self, event: Event) -> None:
        self.events.append(event)

    def finish(self, ok: bool, summary: str | None = None) -> None:
        self.finished = (ok, summary)

    def of_type(self, cls: type) -> list[Event]:
        return [e for e in self.events if isinstance(e, cls)]

    def output(self, rank: int | None = None, stream: str | None = None) -> str:
        """All ``Log`` text (of one rank / stream if given), in arrival order."""
        return "".join(
            e.text
            for e in self.events
            if isinstance(e, Log)
            and (rank is None or e.rank == rank)
            and (stream is None or e.stream == stream)
        )
