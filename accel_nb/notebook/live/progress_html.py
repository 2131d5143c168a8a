"""The HTML of a launch's widget: title, rank label, details, status, log pane and failure box.

Pure functions of a rank's view (``LaunchProgress``'s per-rank state) and the launch's settings;
``progress_widget.WidgetReporter`` puts them into its ipywidgets.

    status_html(view, "running", ended=None)   # "<span style='color:#1565c0;...'>running</span>" (+ kernel-gone CSS)
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from ...launch.failures import describe
from ...launch.parent.hang_blame import HUNG_CULPRIT
from ...launch.parent.launch_progress import QUIET_AFTER
from ...progress_format import format_duration, format_metrics, format_rate, one_line, plural
from .kernel_restart import GONE_CSS, live_or_gone

__all__ = [
    "PANE_LINES",
    "STATUS_STYLE",
    "esc",
    "failures_html",
    "info_html",
    "label_html",
    "launch_problem_html",
    "pane_html",
    "status_html",
    "title_html",
]

STATUS_STYLE = {  # status -> (bar_style, colour of the status text)
    "starting": ("", "#757575"),
    "running": ("info", "#1565c0"),
    "stalled": ("warning", "#ef6c00"),
    "done": ("success", "#2e7d32"),
    "failed": ("danger", "#c62828"),
    "stopped": ("warning", "#6d4c41"),
    "ready (idle)": ("info", "#1565c0"),  # a session's workers: alive, waiting for the next cell
    HUNG_CULPRIT: ("danger", "#c62828"),  # the rank the hang watchdog found to be the likely cause
}
PANE_LINES = 200  # lines of each rank's log shown in its pane


def esc(text: Any) -> str:
    """``text`` as HTML text (``<``, ``>``, ``&`` escaped)."""
    return html.escape(str(text), quote=False)


def label_html(rank: int, role: str) -> str:
    """``rank 3`` in bold, and under it the role the rank told (``dp 1 · tp 1``), small and grey."""
    head = f"<b>rank {rank}</b>"
    if not role:
        return head
    # one block of two tight lines: the widget's own 28 px line height left the role as far from its
    # rank as from the next row's
    return (
        f"<div style='line-height:1.3;padding-top:3px'>{head}<br><span style='font-size:11px;color:#616161;"
        f"white-space:nowrap' title='this rank&#39;s place in the parallel layout'>{esc(role)}</span></div>"
    )


def title_html(info: dict[str, Any], num_processes: int) -> str:
    """The launch's title line: what runs, on how many processes, its id and start method."""
    bits = ["<b>accel_nb launch</b>"]
    for key in ("title", "desc"):
        if info.get(key):
            bits.append(esc(info[key]))
    bits.append(plural(num_processes, "process"))
    for key in ("launch_id", "start_method"):  # log_dir: shown with a failure (kept only then)
        if info.get(key):
            bits.append(f"{key.replace('_', ' ')}: <code>{esc(info[key])}</code>")
    return " &middot; ".join(bits)


def pane_html(v: Any, finished: bool) -> str:
    """A rank's log pane (``v``: its view in ``LaunchProgress``, None before it said anything)."""
    if v is None or not v.logs:
        return f"<i style='color:#757575'>{'no output' if finished else 'no output yet'}</i>"
    lines = list(v.logs)[-PANE_LINES:]
    out = []
    for stream, line in lines:
        text = esc(line)
        if stream == "stderr":
            text = f"<span style='color:#b71c1c'>{text}</span>"
        elif stream == "stacks":
            text = f"<span style='color:#6d4c41'>{text}</span>"
        out.append(text)
    if v.dropped:  # one running note per rank, however long the flood
        out.append(
            f"<i style='color:#ef6c00'>[{plural(v.dropped, 'line')} dropped so far (too fast to show); "
            "the launch's log files have them all]</i>"
        )
    skipped = v.log_count - len(lines)
    head = (
        f"<i style='color:#757575'>... {skipped} earlier lines (full log in the launch's log files)</i>\n"
        if skipped > 0
        else ""
    )
    return (
        "<pre style='max-height:18em;overflow:auto;margin:0;font-size:12px;line-height:1.3'>"
        + head
        + "\n".join(out)
        + "</pre>"
    )


def info_html(v: Any, now: float, stall_after: float, ended: Any) -> str:
    """A rank's details beside its bar: loops, count, rate, ETA, quiet note, metrics."""
    bits = []
    if v.seen_progress:
        for other in v.open_loops():  # e.g. the epoch loop around the step loop drawn in the bar
            bits.append(esc(other))
        name = v.desc or v.name
        count = f"{v.n}/{v.total}" if v.total else f"{v.n} it"
        bits.append(f"{esc(name)} <b>{count}</b>" if name else f"<b>{count}</b>")
        bits.append(format_rate(v.rate_now(now)))
        if v.total and not (v.failed or v.finished or v.loop_done or ended):
            bits.append(f"ETA {format_duration(v.eta(now))}")
    quiet = v.quiet_note(now, min(QUIET_AFTER, stall_after))
    if quiet:
        bits.append(f"<span style='color:#ef6c00;font-weight:600'>{esc(quiet)}</span>")
    metrics = format_metrics(v.metrics)
    if metrics:
        bits.append(f"<code>{esc(metrics)}</code>")
    if v.logged:
        bits.append(f"<code>{esc(v.logged_text())}</code>")
    if v.dropped:
        bits.append(f"<i>{plural(v.dropped, 'output line')} dropped</i>")
    return " &middot; ".join(bits)


def status_html(v: Any, status: str, ended: Any) -> str:
    """A rank's coloured status; a live one turns into "stopped (kernel gone)" if the kernel dies."""
    colour = STATUS_STYLE.get(status, ("", "#757575"))[1]
    text = status
    if status == "failed" and v.failure is not None:
        text = f"failed: {describe(v.failure, form='label')}"
    shown = f"<span style='color:{colour};font-weight:600;white-space:nowrap'>{esc(text)}</span>"
    if status in ("starting", "running", "stalled") or (ended is None and status not in STATUS_STYLE):
        gone = f"<span style='color:{STATUS_STYLE['stopped'][1]};font-weight:600;white-space:nowrap'>stopped (kernel gone)</span>"
        return GONE_CSS + live_or_gone(shown, gone)
    return shown


_PRE = (
    "<pre style='max-height:24em;overflow:auto;margin:2px 0 6px 0;font-size:12px;"
    "background:#fff5f5;padding:4px;white-space:pre-wrap'>"
)


def failures_html(failed: list[Any], first: int | None, log_dir: str | None, final: bool) -> str:
    """The failure box: the failing ranks' errors (``failed``: their views), ``first``'s first.

    Live, the first failure shows in full with its traceback (usually the cause), the others folded
    (often consequences: peers closing connections). ``final``: the launcher raises its error in the
    cell, which carries the tracebacks, so the box keeps one line per rank and says where they are.
    """
    failed = sorted(failed, key=lambda v: (v.rank != first, v.rank))
    parts = []
    for i, v in enumerate(failed):
        message = str(v.message or "")
        if len(message) > 300:
            message = message[:300] + " ..."
        said = (
            describe(dataclasses.replace(v.failure, message=message), brief=True)
            if v.failure
            else f"rank {v.rank} failed"
        )
        head = esc(said)
        body = esc((v.traceback or "").rstrip())
        if final:
            where = " (its traceback is in the error below)" if v.traceback else ""
            style = "color:#c62828" + (";font-weight:600" if i == 0 else "")
            parts.append(f"<div style='{style}'>{head}{where}</div>")
        elif i == 0:
            parts.append(f"<div style='color:#c62828;font-weight:600'>{head}</div>{_PRE}{body}</pre>")
        else:
            parts.append(
                f"<details><summary style='color:#c62828;cursor:pointer;display:list-item'>{head}</summary>"
                f"{_PRE}{body}</pre></details>"
            )
    if log_dir:
        parts.append(f"<div style='color:#616161'>full per-rank logs: <code>{esc(log_dir)}</code></div>")
    return "<div style='border-left:4px solid #c62828;padding-left:8px'>" + "".join(parts) + "</div>"


def launch_problem_html(summary: str, stacks: bool) -> str:
    """Why a launch without any failing rank ended badly (interrupt, hang), for the failure box.

    ``stacks``: the ranks' Python stacks were dumped into their output panes, and the box says so.
    """
    text = one_line(summary, limit=1000)  # the box wraps: a session's interrupt note is long and whole
    if stacks:
        # a sentence of its own ("...wo ." came of stripping the dots of a cut line before adding one)
        text = (
            text if text.endswith(("...", ".")) else text + "."
        ) + " Each rank's Python stack is in its output pane."
    return (
        "<div style='border-left:4px solid #6d4c41;padding-left:8px;color:#6d4c41;font-weight:600'>"
        f"{esc(text)}</div>"
    )
