"""One live ipywidgets view per launch: a bar per rank, an aggregate line, failures, log panes.

Fed by the launcher's supervisor like any Reporter (``start`` / ``handle`` / ``tick`` /
``finish``), always from the thread that runs the launch: no thread of its own. Widget updates
are coalesced: at most ``1 / min_interval`` syncs per second per launch (10 by default),
whatever the number of events; a failure shows at once, and ``finish`` always flushes the final
state. ``tick`` (a few times a second) keeps quiet ranks honest: "no progress for N s", a rate
that decays, amber once ``stall_after`` passes. When the launch ends, the output's ``text/plain``
becomes a per-rank summary, so executed and saved notebooks show the final state as text too.
A widget that fails to render or update never leaves the cell with nothing: the launch goes on
in the text view (``TextReporter``) from then on, after one line that says why.
Logged metrics (``Accelerator.log``, ``set_postfix``) are drawn as small curves per rank under
the bars (``metric_chart``), with the final picture kept in the output as ``image/png``. The HTML
comes from ``progress_html``, the per-rank output panes are ``log_panes.LogPanes``.

    reporter = WidgetReporter(2, desc="train")
    reporter.start(2, {})
    reporter.handle(Progress(rank=0, name="train", n=5, total=10))
    reporter.finish(ok=True)
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from ... import events as ev
from ...launch.options import parse_show_ranks
from ...launch.parent.launch_progress import QUIET_AFTER, LaunchProgress
from ...launch.parent.output_lines import OutputRelay
from ...launch.parent.reporting import TextReporter
from ...progress_format import format_duration, one_line, plural
from ..widget_compat import view_bundle
from .kernel_restart import GONE_CSS, GONE_NOTE, LIVE_VIEWS, live_or_gone, watch_kernel_shutdown
from .log_panes import LogPanes
from .metric_chart import MetricChart
from .progress_html import (
    STATUS_STYLE,
    esc,
    failures_html,
    info_html,
    label_html,
    launch_problem_html,
    status_html,
    title_html,
)

LABEL_PX = 60  # the width of the "rank N" column (wider once a rank shows its role)


class WidgetReporter(ev.Reporter):
    """Draws one launch in a Jupyter cell; thread-safe; see the module docstring."""

    def __init__(
        self,
        num_processes: int = 1,
        desc: str | None = None,
        min_interval: float = 0.1,
        stall_after: float = 30.0,
        echo_logs: bool = True,
        display: bool = True,
        idle_when_done: bool = False,
        **info: Any,
    ) -> None:
        self.num_processes = max(int(num_processes), 1)
        self.info = {"desc": desc, **info}
        self.min_interval = min_interval
        self.stall_after = stall_after
        self.echo_logs = echo_logs
        self.display = display
        # a session start: ranks that answered are alive and idle, not done
        self.idle_when_done = idle_when_done
        self.session_stopped = False
        self.stop_reason = "its workers ended"
        self.busy_with: str | None = None  # a session start's view: the cell running on the workers now
        self.cells_run = 0
        self.state = LaunchProgress(self.num_processes, stall_after)
        self.widget: Any = None
        self.rows: dict[int, Any] = {}
        self.bars: dict[int, Any] = {}
        self.infos: dict[int, Any] = {}
        self.statuses: dict[int, Any] = {}
        self.labels: dict[int, Any] = {}  # "rank 3", then with its role "rank 3 dp 1 · tp 1"
        self._shown_labels: dict[int, str] = {}
        self.panes: dict[int, Any] = {}  # rank -> its output pane (log_panes.panes, once built)
        self.log_panes: LogPanes | None = None
        self.title: Any = None
        self.aggregate: Any = None
        self.failure_box: Any = None
        self.logs: Any = None  # the panes' accordion
        self.flushes = 0  # how many times the widgets were synced (for tests and benchmarks)
        self._lock = threading.RLock()
        self._dirty = False
        self._last_flush = 0.0
        self._started = False
        self._finished = False
        self._display_handle: Any = None
        self._shown_rows: dict[int, tuple[str, str]] = {}  # rank -> (status, info html) last synced
        self._shown_elapsed = ""  # the aggregate line's clock, as last synced
        self.text_view: TextReporter | None = None  # set when the widget failed: the text view took over
        self.fallback_reason: str | None = None  # why, as the one line said
        self.relay = OutputRelay(self.num_processes, parse_show_ranks(info.get("show_ranks", "all")))

    # -- Reporter protocol -------------------------------------------------------------------
    def start(self, num_processes: int | None = None, info: dict[str, Any] | None = None) -> None:
        """Build the widget and show it in the current cell."""
        with self._lock:
            if self._started:
                return
            self._started = True
            if num_processes:
                self.num_processes = max(int(num_processes), 1)
            self.info.update({k: v for k, v in (info or {}).items() if v is not None})
            self.state = LaunchProgress(self.num_processes, self.stall_after)
            self.relay = OutputRelay(self.num_processes, parse_show_ranks(self.info.get("show_ranks", "all")))
            try:
                self._build()
                self._flush_locked(force=True)
            except Exception as exc:  # noqa: BLE001 - said in one line; the text view takes over
                self._fall_back("render", exc)
                return
        if self.display:
            self._show()
            LIVE_VIEWS.add(self)
            watch_kernel_shutdown()

    def handle(self, event: Any) -> None:
        """Fold one event in; sync the widgets if ``min_interval`` passed (a failure: at once)."""
        if not self._started:
            self.start(self.num_processes, None)
        if self.text_view is not None:
            self.text_view.handle(event)
            return
        if self.echo_logs and isinstance(event, (ev.Log, ev.Dropped)):
            self.relay.add(event)
        if isinstance(event, ev.Heartbeat):
            self.tick()
            return
        with self._lock:
            self.state.apply(event)
            if self.text_view is not None:  # the widget failed on another thread meanwhile
                return
            try:
                failure = isinstance(event, ev.Failure)
                if failure:
                    self._show_failures()
                now = time.monotonic()
                # a rank's last events may come in after finish(): the final view shows them
                if self._finished:
                    self._flush_locked(force=True, now=now)
                elif failure or now - self._last_flush >= self.min_interval:
                    self._flush_locked(now=now)
                else:
                    self._dirty = True  # the ticker thread flushes it within min_interval
            except Exception as exc:  # noqa: BLE001 - said in one line; the text view takes over
                self._fall_back("update", exc)

    def finish(self, ok: bool, summary: str | None = None) -> None:
        """Show the final state (always flushed) and leave a text summary in the output."""
        if not self._started:
            self.start(self.num_processes, None)
        if self.echo_logs and self.text_view is None:
            self.relay.finish()
        with self._lock:
            if self._finished:
                return
            self._finished = True
            if summary:
                self.info["summary"] = summary
            if self.text_view is None:
                self.state.finish(ok)
                try:
                    self._show_failures(final=not ok)
                    if not ok and summary and not any(v.failed for v in self.state.ranks.values()):
                        self._show_launch_problem(summary)  # interrupted, hung: no rank raised
                    self._flush_locked(force=True)
                    self._offer_full_logs(ok)
                except Exception as exc:  # noqa: BLE001 - said in one line; the text view takes over
                    self._fall_back("show the final state", exc)
            if self.text_view is not None:
                self.text_view.finish(ok, summary)  # it shares self.state: finishes it too
        if not (self.idle_when_done and ok):  # a started session's view stays live until it stops
            LIVE_VIEWS.discard(self)
        self._leave_text_summary(ok, summary)

    def _offer_full_logs(self, ok: bool) -> None:
        """Under each kept log's pane (after a failure, or dropped output), a control that shows it as text."""
        log_dir = self.info.get("log_dir")
        if (
            not log_dir
            or (ok and not any(v.dropped for v in self.state.ranks.values()))
            or self.log_panes is None
        ):
            return
        import ipywidgets as W

        self.log_panes.offer_full_logs(W, log_dir)

    def kernel_shutting_down(self, restart: bool) -> None:
        """The kernel is asked to restart (or shut down): this view's last state says so (any thread)."""
        what = "restarting" if restart else "shutting down"
        if self.idle_when_done:
            self.mark_session_stopped(f"the kernel is {what}; the session's workers end with it")
            return
        note = f"the kernel is {what}: this launch was stopped, its ranks end with the kernel"
        with self._lock:
            if self._finished or self.text_view is not None:
                return
            self._finished = True
            self.info["summary"] = note
            self.state.finish(False)
            try:
                self._show_failures(final=True)
                self._show_launch_problem(note)
                self._flush_locked(force=True)
            except Exception:  # noqa: BLE001 - the kernel goes anyway
                return
        LIVE_VIEWS.discard(self)
        self._leave_text_summary(False, note)

    def _fall_back(self, what: str, exc: BaseException) -> None:
        """The widget failed: one line says why, and the text view shows the rest of this launch."""
        with self._lock:
            if self.text_view is not None:
                return
            self.fallback_reason = one_line(f"{type(exc).__name__}: {exc}")
            print(
                f"[accel_nb] the progress widget could not {what} ({self.fallback_reason}); "
                "showing text progress for the rest of this launch",
                file=sys.stderr,
                flush=True,
            )
            if self.echo_logs:
                self.relay.flush()  # what the ranks printed so far, before the text view's lines
            text = TextReporter(show_ranks=self.info.get("show_ranks", "all"), stall_after=self.stall_after)
            text.start(self.num_processes, dict(self.info))
            text.state = self.state  # one state: the final summary counts every event, before and after
            self.text_view = text
            self._display_handle = None  # the widget's output may be stale: the summary is printed

    # -- building ------------------------------------------------------------------------------
    def _build(self) -> None:
        import ipywidgets as W

        self.title = W.HTML(value=self._title_html())
        rows = []
        for r in range(self.num_processes):
            rows.append(self._make_row(W, r))
        self.rows_box = W.VBox(rows)
        self.aggregate = W.HTML(value="")
        self.chart = MetricChart()
        self.failure_box = W.HTML(value="", layout=W.Layout(display="none"))
        self.log_panes = LogPanes(W, self.num_processes, self.state.ranks, self._finished)
        self.panes, self.logs = self.log_panes.panes, self.log_panes.accordion
        self.widget = W.VBox(
            [self.title, self.rows_box, self.aggregate, self.chart.widget, self.failure_box, self.logs],
            layout=W.Layout(width="100%"),
        )

    def _make_row(self, W: Any, rank: int) -> Any:
        # fixed columns (label, bar, status) so rows line up; the details take the rest and wrap
        self.bars[rank] = W.IntProgress(value=0, min=0, max=1, bar_style="", layout=W.Layout(flex="0 0 30%"))
        self.infos[rank] = W.HTML(value="", layout=W.Layout(flex="1 1 0%", min_width="0"))
        self.statuses[rank] = W.HTML(value="", layout=W.Layout(flex="0 0 180px"))
        label = W.HTML(value=f"<b>rank {rank}</b>", layout=W.Layout(flex=f"0 0 {LABEL_PX}px"))
        self.labels[rank] = label
        self._shown_labels[rank] = label.value
        self.rows[rank] = W.HBox([label, self.bars[rank], self.statuses[rank], self.infos[rank]])
        return self.rows[rank]

    def _sync_labels(self) -> None:
        """Show the roles that came in; widen every label alike so the rows stay lined up."""
        changed = False
        for r, label in self.labels.items():
            if r in self.state.ranks:
                value = label_html(r, self.state.ranks[r].role_text())
                if self._shown_labels.get(r) != value:
                    label.value = self._shown_labels[r] = value
                    changed = True
        if changed:
            longest = max((len(v.role_text()) for v in self.state.ranks.values()), default=0)
            px = max(LABEL_PX, 7 * longest + 8)  # ~7 px a character at 11 px
            for label in self.labels.values():
                label.layout.flex = f"0 0 {px}px"

    def _add_missing_rows(self) -> None:
        """A rank we did not expect (num_processes was wrong): give it a row and a pane."""
        missing = [r for r in sorted(self.state.ranks) if r not in self.rows]
        if not missing or self.widget is None:
            return
        import ipywidgets as W

        for r in missing:
            self._make_row(W, r)
        self.rows_box.children = tuple(self.rows[r] for r in sorted(self.rows))
        self.log_panes.add(W, missing)

    def _show(self) -> None:
        """Put the widget in the cell's output (IPython's public display API, both widget generations)."""
        try:
            from IPython.display import display

            bundle = view_bundle(self.widget, self._plain_running())
            self._display_handle = display(bundle, raw=True, display_id=True)
        except Exception as exc:  # noqa: BLE001 - said in one line; the text view takes over
            self._display_handle = None
            self._fall_back("render", exc)

    # -- rendering (progress_html) -------------------------------------------------------------
    def _title_html(self) -> str:
        return title_html(self.info, self.num_processes)

    def _info_html(self, rank: int, now: float | None = None) -> str:
        now = self.state.clock(now)
        return info_html(self.state.ranks[rank], now, self.stall_after, ended=self.state.ended)

    def _status_html(self, rank: int, status: str) -> str:
        return status_html(self.state.ranks[rank], status, ended=self.state.ended)

    def _show_failures(self, final: bool = False) -> None:
        """The failing ranks' errors in the failure box, and the first one's output pane opened.
        ``final``: the launcher raises its error (``LaunchError``, with the tracebacks) in this cell, so
        the box keeps one line per rank (``progress_html.failures_html``)."""
        failed = [v for v in self.state.ranks.values() if v.failed]
        if not failed or self.failure_box is None:
            return
        first = self.state.first_failure
        self.failure_box.value = failures_html(failed, first, self.info.get("log_dir"), final)
        self.failure_box.layout.display = None
        if first is not None and self.log_panes is not None:
            self.log_panes.open(first, self.state.ranks)

    def _show_launch_problem(self, summary: str) -> None:
        """Why a launch without any failing rank ended badly (interrupt, hang), in the failure box."""
        if self.failure_box is None:
            return
        stacks = any(stream == "stacks" for v in self.state.ranks.values() for stream, _ in v.logs)
        self.failure_box.value = launch_problem_html(summary, stacks)
        self.failure_box.layout.display = None

    def _flush_locked(self, force: bool = False, now: float | None = None) -> None:
        """Push the state into the widgets (caller holds the lock)."""
        if self.widget is None:
            return
        now = time.monotonic() if now is None else now
        self._add_missing_rows()
        self._sync_labels()
        for r in sorted(self.state.ranks):
            v = self.state.ranks[r]
            status = self._status(r, now)
            info = self._info_html(r, now)
            if status in ("starting", "running", "stalled") and info:
                info = live_or_gone(info, "")  # no frozen rate or ETA once the kernel is gone
            self._shown_rows[r] = self._row_key(r, now)
            bar = self.bars[r]
            with bar.hold_sync():
                if v.total:
                    if bar.max != v.total:
                        bar.max = max(int(v.total), 1)
                    bar.value = min(max(int(v.n), 0), bar.max)
                elif status in ("done", "ready (idle)"):
                    bar.max, bar.value = 1, 1
                bar.bar_style = STATUS_STYLE.get(status, ("info", ""))[0]
            self.statuses[r].value = self._status_html(r, status)
            self.infos[r].value = info
        line = f"<span style='color:#424242'>{esc(self._aggregate_line(now))}</span>"
        if self.state.ended is None and not self.session_stopped:
            gone = f"<span style='color:#6d4c41;font-weight:600'>{esc(GONE_NOTE)}</span>"
            line = GONE_CSS + live_or_gone(line, gone)
        self.aggregate.value = line
        self._shown_elapsed = self._elapsed_text()
        self.chart.update(self.state.history, now, force=force)
        self.log_panes.refresh(self.state.ranks, self._finished, now, force=force)
        # still dirty only if a log pane waits for its own (slower) refresh
        self._dirty = self.log_panes.pending(self.state.ranks, self._finished)
        self._last_flush = now
        self.flushes += 1

    def _status(self, rank: int, now: float | None = None) -> str:
        status = self.state.status(rank, now)
        if self.session_stopped:
            return "stopped"
        if status == "done" and self.idle_when_done:
            return "running" if self.busy_with else "ready (idle)"
        return status

    def _elapsed_text(self) -> str:
        return format_duration(self.state.elapsed())

    def _aggregate_line(self, now: float | None = None) -> str:
        if self.session_stopped:
            return f"{plural(len(self.state.ranks), 'rank')}: stopped ({self.stop_reason})"
        if self.idle_when_done and self.state.ended is not None and self.state.ok:
            ranks, run = plural(len(self.state.ranks), "rank"), plural(self.cells_run, "cell")
            if self.busy_with:
                return f"{ranks}: running {self.busy_with} (its progress and output are in that cell) | {run} run"
            return (
                f"{ranks}: ready (idle, waiting for %%accelerate cells) | {run} run "
                f"| started in {self._elapsed_text()}"
            )
        return self.state.aggregate_line(now)

    def mark_session_busy(self, label: str | None, cells_run: int) -> None:
        """A session start's view: a cell (``label``) runs on the workers now, or none (``None``)."""
        with self._lock:
            if self.session_stopped or not self.idle_when_done:
                return
            self.busy_with, self.cells_run = label, cells_run
            if self.text_view is None:
                self._flush_locked(force=True)

    def mark_session_stopped(self, reason: str | None = None) -> None:
        """The session these ranks belong to was stopped: every row and the summary say so (from any cell)."""
        LIVE_VIEWS.discard(self)
        with self._lock:
            if self.session_stopped or not self.idle_when_done:
                return
            self.session_stopped = True
            if reason:
                self.stop_reason = reason
            if self.text_view is None:
                try:
                    self._flush_locked(force=True)
                except Exception:  # noqa: BLE001 - an old view that cannot update: the stop itself went fine
                    return
        if self._display_handle is not None and self.text_view is None:
            try:
                self._display_handle.update(view_bundle(self.widget, self.summary_text()), raw=True)
            except Exception:  # noqa: BLE001 - same: only the old cell's view is stale
                pass

    def _row_key(self, rank: int, now: float) -> tuple[str, str | None]:
        """What makes a quiet rank's row worth redrawing: its status and its whole quiet seconds."""
        v = self.state.ranks[rank]
        return self._status(rank, now), v.quiet_note(now, min(QUIET_AFTER, self.stall_after))

    def tick(self) -> None:
        """Flush pending updates and redraw rows whose quiet time, rate or status moved on.

        Called by the supervisor a few times a second (and on heartbeats), from the launch's thread.
        """
        if self.text_view is not None:
            self.text_view.tick()
            return
        if self.echo_logs:
            self.relay.tick()
        with self._lock:
            if self._finished or self.widget is None or self.text_view is not None:
                return
            now = time.monotonic()
            if now - self._last_flush < self.min_interval:
                return
            try:
                if (
                    self._dirty
                    or self.chart.pending(self.state.history)
                    # the clock runs from the start, quiet or not
                    or self._shown_elapsed != self._elapsed_text()
                    or any(self._shown_rows.get(r) != self._row_key(r, now) for r in self.state.ranks)
                ):
                    self._flush_locked(now=now)
            except Exception as exc:  # noqa: BLE001 - said in one line; the text view takes over
                self._fall_back("update", exc)

    # -- text ----------------------------------------------------------------------------------
    def _plain_running(self) -> str:
        desc = self.info.get("desc") or self.info.get("title")
        head = f"accel_nb launch{': ' + str(desc) if desc else ''} ({plural(self.num_processes, 'process')})"
        return head + " - live progress widget (run in Jupyter with ipywidgets to see it)"

    def summary_text(self, ok: bool | None = None, summary: str | None = None) -> str:
        """The final per-rank state as plain text."""
        if self.idle_when_done and (self.session_stopped or (ok is not False and self.state.ok)):
            word = (
                f"stopped ({self.stop_reason})" if self.session_stopped else "ready: workers alive and idle"
            )
            lines = [f"accel_nb session {word}: {plural(len(self.state.ranks), 'rank')}"]
            lines += [f"  {self.state.rank_label(r)} {self._status(r)}" for r in sorted(self.state.ranks)]
            return "\n".join(lines)
        return "\n".join(self.state.summary_lines(ok, summary))

    def _leave_text_summary(self, ok: bool, summary: str | None) -> None:
        text = self.summary_text(ok, summary)
        if self._display_handle is not None and self.text_view is None:
            try:
                bundle = view_bundle(self.widget, text)
                bundle.update(self.chart.mime_png())  # the final curves, for viewers without the widget
                self._display_handle.update(bundle, raw=True)
                return
            except Exception as exc:  # noqa: BLE001 - said in one line; the summary is printed instead
                self._fall_back("show the final state", exc)
        if self.display or self.text_view is not None:
            print(text)
