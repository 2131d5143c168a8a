"""What the parent knows about each rank of a launch: status, loop position, rate, quiet time.

:class:`LaunchProgress` folds the events of one launch into a per-rank view (status, loop
position, rate, ETA, latest metrics, failure, recent log lines). The widget draws it, the text
reporter reads its quiet times, and both leave its :meth:`~LaunchProgress.summary_lines`.

A rank that stops sending events is not frozen at its last numbers: :meth:`RankView.quiet_for`
counts the seconds since it last did anything, the shown rate decays once a step is overdue
(a loop that made no step in ``q`` seconds runs at most at ``1/q`` steps a second), and after
``stall_after`` seconds a rank that had shown progress reads ``stalled``.

    state = LaunchProgress(2)
    state.apply(Progress(rank=0, name="train", n=5, total=10))
    print(state.summary_lines(ok=True))
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ... import events as ev
from ...progress_format import (
    eta_seconds,
    format_duration,
    format_metrics,
    format_progress_line,
    format_rate,
    one_line,
    plural,
)
from ..failures import FirstToFail, describe
from .hang_blame import HUNG_CULPRIT
from .metric_history import MetricHistory
from .rank_debugger import debugger_phase

STALL_AFTER = 30.0  # seconds without any event from a running rank that showed progress
QUIET_AFTER = 5.0  # seconds of silence after which a running rank's row says "no progress for N s"
LOG_LINES_KEPT = 500  # per rank, for the log panes (full logs live in the launcher's files)


@dataclass
class RankView:
    """Everything shown for one rank."""

    rank: int
    phase: str = "starting"  # last Phase event, or running/done/failed
    name: str | None = None  # the loop shown (the last one that reported)
    desc: str | None = None
    n: int = 0
    total: int | None = None
    rate: float | None = None
    loop_done: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)  # from the loop's set_postfix / set_metrics
    # per bar description: (offset, last position) so set_postfix values of successive bars (one per
    # epoch) are drawn one after the other, not on top of each other
    postfix_x: dict[str, tuple[int, int]] = field(default_factory=dict)
    logged: dict[str, Any] = field(default_factory=dict)  # from Accelerator.log_metrics
    step: int | None = None  # the step of the last log_metrics call
    finished: bool = False  # Result seen
    failed: bool = False
    failure: ev.Failure | None = None  # how it failed (``failures.describe`` words it)
    message: str | None = None
    traceback: str | None = None
    last_event: float = field(default_factory=time.monotonic)  # any event but a heartbeat
    seen_progress: bool = False
    dropped: int = 0  # output lines not shown (too fast); the rank's log file has them
    loops: dict[str, tuple[int, int | None, str, bool]] = field(
        default_factory=dict
    )  # name -> n, total, label, done
    logs: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES_KEPT))
    log_count: int = 0
    role: ev.Role | None = None  # the rank's mesh coordinates or pipeline stage, when it sent them

    def role_text(self) -> str:
        """``"dp 1 · tp 1"`` (the dimensions above size 1), ``"pp 1/2 · layers 2-3"``, or ``""``."""
        return self.role.text() if self.role is not None else ""

    def quiet_for(self, now: float) -> float:
        """Seconds since this rank last sent anything but a heartbeat (0 while it waits on a debugger)."""
        if debugger_phase(self.phase):
            return 0.0
        return max(now - self.last_event, 0.0)

    def rate_now(self, now: float | None = None) -> float | None:
        """The loop's rate, decayed once a step is overdue: no step in ``q`` s means at most ``1/q`` it/s.

        Steps are reported at least every ~0.1 s while they happen, so silence past twice the
        expected time between two reports (at least 1 s) is taken as "no step since".
        """
        rate = self.rate
        if not rate or rate <= 0 or now is None or self.finished or self.failed:
            return rate
        grace = max(2.0 / rate, 1.0)
        quiet = self.quiet_for(now)
        return rate if quiet <= grace else rate * grace / quiet

    def eta(self, now: float | None = None) -> float | None:
        if self.finished or self.loop_done:
            return 0.0 if self.total else None
        return eta_seconds(self.n, self.total, self.rate_now(now))

    def quiet_note(self, now: float, quiet_after: float = QUIET_AFTER) -> str | None:
        """``"no progress for 42 s"`` when a running rank has been silent a while, else ``None``."""
        if self.finished or self.failed:
            return None
        if self.rate and not self.loop_done:
            quiet_after = max(quiet_after, 3.0 / self.rate)  # a slow step is not silence
        quiet = self.quiet_for(now)
        if quiet < quiet_after:
            return None
        what = "progress" if self.seen_progress else "output"
        return f"no {what} for {format_duration(quiet) if quiet >= 60 else f'{quiet:.0f} s'}"

    def open_loops(self) -> list[str]:
        """The other loops of this rank still running (an outer epoch loop...), as ``"epoch 2/3"``."""
        out = []
        for name, (n, total, label, done) in self.loops.items():
            if name != self.name and not done:
                out.append(f"{label} {n}/{total}" if total else f"{label} {n}")
        return out

    def logged_text(self) -> str:
        """``"step 3: loss=0.25 lr=0.001"`` for the latest ``log_metrics`` values."""
        step = f"step {self.step}: " if self.step is not None else ""
        return step + format_metrics(self.logged)

    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(max(self.n / self.total, 0.0), 1.0)


class LaunchProgress:
    """The per-rank state of one launch, updated by :meth:`apply` for every event."""

    def __init__(self, num_processes: int, stall_after: float = STALL_AFTER) -> None:
        self.num_processes = max(int(num_processes), 1)
        self.stall_after = stall_after
        self.ranks = {r: RankView(r) for r in range(self.num_processes)}
        self.started = time.monotonic()
        self.ended: float | None = None
        self.ok: bool | None = None
        self.first_to_fail = FirstToFail()
        self.history = MetricHistory()  # numeric metrics per rank over time, for the live curves

    def view(self, rank: int) -> RankView:
        if rank not in self.ranks:  # more ranks than announced (or an odd rank id): show it anyway
            self.ranks[rank] = RankView(rank)
            self.num_processes = max(self.num_processes, len(self.ranks))
        return self.ranks[rank]

    def apply(self, event: Any) -> bool:
        """Fold ``event`` in; True when it changed a rank's status (worth showing at once)."""
        rank = getattr(event, "rank", None)
        if rank is None or rank < 0:
            return False
        v = self.view(int(rank))
        now = time.monotonic()
        before = self.status(v.rank, now)
        if isinstance(event, ev.Progress):
            v.name, v.desc, v.n, v.total = event.name, event.desc, event.n, event.total
            v.loops[event.name] = (event.n, event.total, event.desc or event.name, event.done)
            if len(v.loops) > 16:  # loops made in a loop (a fresh name each time): keep the recent ones
                v.loops.pop(next(iter(v.loops)))
            v.rate, v.loop_done = event.rate, event.done
            if event.metrics:
                v.metrics.update(event.metrics)
                self.history.add(v.rank, event.metrics, x=_postfix_x(v, event))
            v.seen_progress = True
            if not v.finished and not v.failed:
                v.phase = "running"
            v.last_event = now
        elif isinstance(event, ev.Metrics):
            v.logged.update(event.values)
            self.history.add(v.rank, event.values, x=event.step)
            if event.step is not None:
                v.step = event.step
            v.last_event = now
        elif isinstance(event, ev.Log):
            for line in event.text.splitlines():
                v.logs.append((event.stream, line))
                v.log_count += 1
            v.last_event = now
        elif isinstance(event, ev.Phase):
            if not v.finished and not v.failed:
                v.phase = event.phase
            v.last_event = now
        elif isinstance(event, ev.Result):
            v.finished = True
            v.phase = "done"
            v.last_event = now
        elif isinstance(event, ev.Failure):
            v.failed = True
            v.phase = "failed"
            v.failure, v.message, v.traceback = event, event.message, event.traceback
            self.first_to_fail.record(v.rank)
            v.last_event = now
        elif isinstance(event, ev.Dropped):
            v.dropped = max(v.dropped, event.count)
            v.last_event = now
        elif isinstance(event, ev.Role):
            v.role = event  # the latest layout this rank joined (a session cell may build another)
        elif isinstance(event, ev.Stacks):
            why = "when stopped" if getattr(event, "reason", "hang") == "interrupt" else "hang watchdog"
            lines = [f"--- Python stacks ({why}) ---", *event.text.splitlines()]
            for line in lines:
                v.logs.append(("stacks", line))
            v.log_count += len(lines)
        return self.status(v.rank, now) != before

    @property
    def first_failure(self) -> int | None:
        """The rank that failed first (``None`` while none failed)."""
        return self.first_to_fail.rank

    def finish(self, ok: bool) -> None:
        self.ended = time.monotonic()
        self.ok = ok
        for v in self.ranks.values():
            if ok and not v.failed:
                v.finished, v.phase = True, "done"
            elif not v.finished and not v.failed and v.phase != HUNG_CULPRIT:
                v.phase = "stopped"

    def status(self, rank: int, now: float | None = None) -> str:
        """``starting`` / a phase name / ``running`` / ``stalled`` / ``done`` / ``failed`` / ``stopped``."""
        v = self.ranks[rank]
        if v.failed:
            return "failed"
        if v.finished:
            return "done"
        if self.ended is not None:
            return v.phase
        now = time.monotonic() if now is None else now
        if v.seen_progress and v.quiet_for(now) > self.stall_after:
            return "stalled"
        return v.phase

    def clock(self, now: float | None = None) -> float:
        """The time a view is drawn for: ``now``, or the end of the launch once it ended."""
        if self.ended is not None:
            return self.ended
        return time.monotonic() if now is None else now

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    # -- text ------------------------------------------------------------------------------
    def rank_label(self, rank: int) -> str:
        """``"rank 3"``, or with the role the rank told: ``"rank 3 [dp 1 · tp 1]"``."""
        role = self.ranks[rank].role_text()
        return f"rank {rank} [{role}]" if role else f"rank {rank}"

    def rank_line(self, rank: int, now: float | None = None, label: bool = True, width: int = 0) -> str:
        """``"rank 0 done     train: 100%|####| 100/100 [2300 it/s] loss=0.1"``, always one line.

        A rank that told its role reads ``"rank 3 [dp 1 · tp 1] done ..."``; ``width`` pads that label
        (so the rows of a summary line up).
        """
        v = self.ranks[rank]
        now = self.clock(now)
        status = self.status(rank, now)
        parts = [f"{self.rank_label(rank):<{width}}", f"{status:<8}"] if label else [status]
        if v.seen_progress:
            parts.append(format_progress_line(v.n, v.total, v.rate_now(now), None, v.desc or v.name))
        quiet = v.quiet_note(now, min(QUIET_AFTER, self.stall_after))
        if quiet:
            parts.append(f"({quiet})")
        metrics = format_metrics(v.metrics)
        if metrics:
            parts.append(metrics)
        if v.logged:
            parts.append(v.logged_text())
        if v.failure is not None:
            parts.append(describe(v.failure, form="detail", brief=True))
        if v.dropped:
            parts.append(f"[{plural(v.dropped, 'output line')} dropped]")
        return " ".join(parts).rstrip()

    def aggregate_line(self, now: float | None = None) -> str:
        """``"2 ranks: 1 running, 1 done | 4500 it/s total | slowest ETA 0:12 | elapsed 0:03"``."""
        now = self.clock(now)
        counts: dict[str, int] = {}
        for r in self.ranks:
            s = self.status(r, now)
            counts[s] = counts.get(s, 0) + 1
        parts = [f"{plural(len(self.ranks), 'rank')}: " + ", ".join(f"{c} {s}" for s, c in counts.items())]
        # rates and ETAs are live figures: once the launch ended (a failure or an interrupt stopped
        # running ranks) they no longer describe anything
        running = [
            v
            for v in self.ranks.values()
            if self.ended is None and not v.finished and not v.failed and v.seen_progress
        ]
        rates = [rate for rate in (v.rate_now(now) for v in running) if rate]
        if rates:
            parts.append(f"{format_rate(sum(rates))} total")
        etas = [v.eta(now) for v in running if not v.loop_done]
        if etas and all(e is not None for e in etas):
            parts.append(f"slowest ETA {format_duration(max(etas))}")  # type: ignore[type-var]
        parts.append(f"elapsed {format_duration(self.elapsed())}")
        return " | ".join(parts)

    def summary_lines(self, ok: bool | None = None, summary: str | None = None) -> list[str]:
        """The final state in a few lines (kept in saved notebooks, printed in text mode).

        ``summary`` (the launcher's one-line verdict) is added only when no rank row already
        says it: a failing rank's row carries its error; an interrupt or a hang has no such row.
        """
        ok = self.ok if ok is None else ok
        word = "finished" if ok else "failed"
        head = f"accel_nb launch {word}: {plural(self.num_processes, 'process')} in {format_duration(self.elapsed())}"
        lines = [head]
        roles = any(v.role_text() for v in self.ranks.values())  # labels of unequal widths: line them up
        width = max(len(self.rank_label(r)) for r in self.ranks) if roles else 0
        lines += ["  " + self.rank_line(r, width=width) for r in sorted(self.ranks)]
        if summary and not any(v.failed for v in self.ranks.values()):
            lines.append("  " + one_line(summary))
        return lines


def _postfix_x(v: RankView, event: ev.Progress) -> int:
    """Where a bar's ``set_postfix`` values go on the curves: a step that keeps counting across the
    bars of one description (a new epoch's bar starts where the last one ended), not the bar's position."""
    key = event.desc or event.name
    offset, last = v.postfix_x.get(key, (0, 0))
    if event.n < last:  # a new bar of the same description (the next epoch): continue after the last one
        offset += last
    v.postfix_x[key] = (offset, event.n)
    return offset + event.n
