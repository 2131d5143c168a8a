"""Reporters turn a launch's events into something to look at: text lines, or a list (tests).

rep = TextReporter(show_ranks=0)        # only rank 0's output; failures of any rank always shown
notebook_launcher(fn, num_processes=2, reporter=rep)
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from ..events import Event, Failure, Heartbeat, Log, Metrics, Phase, Progress, Result, Stacks


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_metrics(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in metrics.items())


def format_progress(event: Progress) -> str:
    """``train 50/100 (2.1 it/s) loss=0.31``."""
    name = event.desc or event.name
    count = f"{event.n}/{event.total}" if event.total is not None else f"{event.n}"
    rate = f" ({event.rate:.3g} it/s)" if event.rate else ""
    metrics = f" {format_metrics(event.metrics)}" if event.metrics else ""
    done = " done" if event.done else ""
    return f"{name} {count}{rate}{metrics}{done}"


def parse_show_ranks(show_ranks: Any) -> set[int] | None:
    """``"all"``/None -> None (every rank); ``0`` -> {0}; ``[0, 2]`` -> {0, 2}."""
    if show_ranks is None or show_ranks == "all":
        return None
    if isinstance(show_ranks, int):
        return {show_ranks}
    if isinstance(show_ranks, str):
        return {int(x) for x in show_ranks.split(",") if x.strip()}
    return {int(x) for x in show_ranks}


class TextReporter:
    """Rank-prefixed whole lines; progress at most once per ``progress_interval`` s per rank (plus the last)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        err_stream: TextIO | None = None,
        show_ranks: Any = "all",
        progress_interval: float = 1.0,
    ) -> None:
        self._stream = stream
        self._err_stream = err_stream
        self.show = parse_show_ranks(show_ranks)
        self.progress_interval = progress_interval
        self.num_processes = 0
        self.info: dict[str, Any] = {}
        self._last_progress: dict[tuple[int, str], float] = {}
        self._lock = threading.Lock()
        self._failure_shown = False

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

    def _write(self, stream: TextIO, text: str) -> None:
        with self._lock:
            stream.write(text)
            stream.flush()

    def handle(self, event: Event) -> None:
        rank = event.rank
        if isinstance(event, Log):
            if not self.shown(rank):
                return
            prefix = f"[rank {rank}] "
            text = "".join(prefix + line + "\n" for line in event.text.splitlines())
            self._write(self.err if event.stream == "stderr" else self.out, text)
        elif isinstance(event, Progress):
            if not self.shown(rank):
                return
            key = (rank, event.name)
            now = time.monotonic()
            final = event.done or (event.total is not None and event.n >= event.total)
            if not final and now - self._last_progress.get(key, -1e9) < self.progress_interval:
                return
            self._last_progress[key] = now
            self._write(self.out, f"[rank {rank}] {format_progress(event)}\n")
        elif isinstance(event, Metrics):
            if not self.shown(rank):
                return
            key = (rank, "\0metrics")
            now = time.monotonic()
            if now - self._last_progress.get(key, -1e9) < self.progress_interval:
                return
            self._last_progress[key] = now
            step = f"step {event.step}: " if event.step is not None else ""
            self._write(self.out, f"[rank {rank}] {step}{format_metrics(event.values)}\n")
        elif isinstance(event, Failure):
            # one line as it happens; the traceback is shown once, in the LaunchError the cell raises
            first = not self._failure_shown
            self._failure_shown = True
            then = ", stopping the other ranks" if first else ""
            self._write(self.err, f"[rank {rank}] failed: {event.exc_type}: {event.message}{then}\n")
        elif isinstance(event, Stacks):
            text = f"[rank {rank}] Python stacks (hang watchdog):\n" + "".join(
                f"[rank {rank}]   {line}\n" for line in event.text.splitlines()
            )
            self._write(self.err, text)
        elif isinstance(event, (Heartbeat, Phase, Result)):
            return

    def finish(self, ok: bool, summary: str | None = None) -> None:
        if not ok and summary and not self._failure_shown:
            log_dir = self.info.get("log_dir")
            where = f" (full logs: {log_dir})" if log_dir else ""
            self._write(self.err, f"[accel_nb] {summary}{where}\n")


class ListReporter:
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


class TeeReporter:
    """Feeds several reporters (e.g. a widget plus a ListReporter)."""

    def __init__(self, *reporters: Any) -> None:
        self.reporters = reporters

    def start(self, num_processes: int, info: dict[str, Any]) -> None:
        for r in self.reporters:
            r.start(num_processes, info)

    def handle(self, event: Event) -> None:
        for r in self.reporters:
            r.handle(event)

    def finish(self, ok: bool, summary: str | None = None) -> None:
        for r in self.reporters:
            r.finish(ok, summary)
