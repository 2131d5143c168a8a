"""Small live curves of the metrics each rank reports, for the launch's progress widget.

One panel per metric (the first ``MAX_PANELS`` reported), one line per rank, drawn with
matplotlib into a PNG shown by an ipywidgets ``Image``. Under it, a text line per metric (points
and latest value per rank), which is all there is where matplotlib is not installed. Redrawn at
most once per ``interval`` seconds (longer if drawing is slow: it never takes more than a fifth of
the launch thread's time) and only when new points came in.

    chart = MetricChart()
    chart.update(launch_progress.history, now=time.monotonic())   # throttled
    chart.update(launch_progress.history, force=True)             # the final picture
"""

from __future__ import annotations

import html
import io
import math
import time
from typing import Any

from ...launch.parent.metric_history import MetricHistory

__all__ = ["MetricChart", "render_png"]

CHART_INTERVAL = 1.0  # seconds between two redraws of the curves
MAX_PANELS = 6  # metrics drawn; the text line lists them all


def render_png(history: MetricHistory, max_panels: int = MAX_PANELS) -> bytes | None:
    """The curves as PNG bytes, or None without matplotlib (or without points).

    Example:
        png = render_png(history)   # b'\\x89PNG...'
    """
    names = curve_names(history)[:max_panels]
    if not names:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    cols = min(len(names), 3)
    rows = math.ceil(len(names) / cols)
    # a Figure with its own Agg canvas: no pyplot, no global state, safe off the main thread
    figure = Figure(figsize=(3.1 * cols, 2.1 * rows), dpi=96)  # fixed margins: a layout engine costs 2x
    figure.subplots_adjust(
        left=0.22 / cols,
        right=0.98,
        top=1 - 0.3 / (2.1 * rows),
        bottom=0.25 / (2.1 * rows),
        wspace=0.28,
        hspace=0.5,
    )
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(rows, cols, squeeze=False).flat)
    for ax, name in zip(axes, names):
        for rank, points in history.series(name).items():
            xs, ys = zip(*points)
            ax.plot(
                xs,
                ys,
                color=f"C{rank % 10}",
                linewidth=1.3,
                label=f"rank {rank}",
                marker="." if len(points) < 25 else None,
                markersize=4,
            )
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    first = figure.axes[0]
    if len(first.get_lines()) > 1:
        first.legend(fontsize=7, frameon=False)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _import_matplotlib() -> None:
    """Import what :func:`render_png` draws with, once (nothing without matplotlib: it says so itself)."""
    try:
        import matplotlib.backends.backend_agg  # noqa: F401 - the import is the point
        import matplotlib.figure  # noqa: F401
    except ImportError:
        pass


def curve_names(history: MetricHistory) -> list[str]:
    """The metrics with a curve to draw: at least one rank reported them at two positions or more.

    A single point per rank is no curve (its value is in the rank's row already).
    """
    return [name for name in history.names() if any(len(p) >= 2 for p in history.series(name).values())]


def points_html(history: MetricHistory, note: str | None = None) -> str:
    """One line per metric with a curve: each rank's number of points, latest value and its step (the x
    the chart draws it at: after several bars of one loop it says how far the counting went)."""
    lines = []
    for name in curve_names(history):
        parts = []
        for rank, points in history.series(name).items():
            x, y = points[-1]
            step = int(x) if float(x).is_integer() else f"{x:.4g}"
            parts.append(f"rank {rank}: {len(points)} pts, last {y:.4g} at step {step}")
        lines.append(f"<b>{html.escape(name)}</b> &middot; " + " &middot; ".join(parts))
    if note and lines:
        lines.append(f"<i>{html.escape(note)}</i>")
    return (
        "<div style='font-size:11px;color:#424242;line-height:1.35'>" + "<br>".join(lines) + "</div>"
        if lines
        else ""
    )


class MetricChart:
    """The curves widget: an ``Image`` (hidden until a metric has a curve: two points) and its text line.

    The text line follows every update (it is cheap: the rows and it show the same latest values);
    only the picture waits ``interval`` between redraws.
    """

    def __init__(self, interval: float = CHART_INTERVAL) -> None:
        import ipywidgets as W

        self.interval = interval
        self.image = W.Image(
            format="png", layout=W.Layout(display="none", max_width="100%", align_self="flex-start")
        )
        self.text = W.HTML(value="")
        self.widget = W.VBox([self.image, self.text])
        self.png: bytes | None = None  # the last picture drawn
        self.renders = 0
        self.note: str | None = None  # why there is no picture
        self._drawn_version = -1
        self._text_version = -1
        self._last = -math.inf

    def pending(self, history: MetricHistory) -> bool:
        """True when points came in since the last redraw."""
        return history.version != self._drawn_version

    def update(self, history: MetricHistory, now: float | None = None, force: bool = False) -> bool:
        """Redraw if new points came in and ``interval`` passed (or ``force``); True if it redrew."""
        now = time.monotonic() if now is None else now
        if not self.pending(history):
            return False
        if not force and now - self._last < self.interval:
            self._update_text(history)  # the latest values now, the picture on its own clock
            return False
        png = None
        took = 0.0
        if self.note is None and curve_names(history):
            # importing matplotlib (seconds in a fresh kernel on a busy machine) is no drawing time: counted
            # in, the first picture's back-off kept the curves at epoch 0 while epoch 2 trained
            _import_matplotlib()
            started = time.monotonic()
            try:
                png = render_png(history)
            except Exception as exc:  # noqa: BLE001 - a drawing problem must never break the launch
                self.note = f"no curves: drawing failed ({type(exc).__name__}: {exc})"
            else:
                if png is None and history:
                    self.note = "text only: pip install matplotlib for live curves"
            took = time.monotonic() - started
        # only now: an interrupt while drawing (a KeyboardInterrupt lands in the kernel's main thread,
        # which draws) leaves the points pending, so the final picture and line still come
        self._drawn_version = history.version
        if png is not None:
            self.png = png
            self.image.value = png
            self.image.layout.display = None
        self._update_text(history)
        self.renders += 1
        self._last = now + 4 * took  # the next redraw waits interval + 4x the drawing time
        return True

    def _update_text(self, history: MetricHistory) -> None:
        if self._text_version != history.version:
            self._text_version = history.version
            self.text.value = points_html(history, self.note)

    def mime_png(self) -> dict[str, Any]:
        """``{"image/png": base64}`` of the last picture, for a saved notebook's output (empty if none)."""
        if self.png is None:
            return {}
        import base64

        return {"image/png": base64.b64encode(self.png).decode("ascii")}
