"""Live metric curves in the progress widget, fed synthetic events in-process (real widgets, real matplotlib)."""

from __future__ import annotations

import sys

import pytest

from accel_nb.events import Metrics, Progress, Result
from accel_nb.launch.parent.metric_history import MetricHistory

pytest.importorskip("ipywidgets")
PNG = b"\x89PNG\r\n\x1a\n"


def _reporter(n=2, **kw):
    from accel_nb.notebook.live.progress_widget import WidgetReporter

    r = WidgetReporter(n, desc="train", display=False, echo_logs=False, **kw)
    r.start(n, {})
    return r


def test_history_keeps_each_ranks_points_and_halves_long_series():
    h = MetricHistory(max_points=10)
    for step in range(25):
        h.add(0, {"loss": 1.0 / (step + 1), "phase": "train"}, x=step)
    h.add(1, {"loss": "0.5"})  # set_postfix text that is a number; no step: the call count
    h.add(1, {"loss": 0.25})
    assert h.names() == ["loss"]  # text that is not a number is no curve
    series = h.series("loss")
    assert series[1] == [(0.0, 0.5), (1.0, 0.25)]
    assert len(series[0]) <= 10 and series[0][0] == (0.0, 1.0) and series[0][-1] == (24.0, 1.0 / 25)
    xs = [x for x, _ in series[0]]
    assert xs == sorted(xs)


def test_widget_draws_every_ranks_logged_metrics_and_postfix_values():
    r = _reporter()
    assert r.chart.image.layout.display == "none" and r.chart.text.value == ""
    for step in range(1, 21):
        for rank in (0, 1):
            r.handle(Metrics(rank, {"loss": 1.0 / step + rank}, step))
            r.handle(Progress(rank, "train", step, 20, {"grad_norm": 0.1 * step}, "train", 100.0, step == 20))
    for rank in (0, 1):
        r.handle(Result(rank, rank))
    r.finish(True)
    chart = r.chart
    assert bytes(chart.image.value).startswith(PNG) and chart.image.layout.display is None
    assert chart.png == bytes(chart.image.value)
    assert r.state.history.names() == ["loss", "grad_norm"]
    for name in ("loss", "grad_norm"):
        series = r.state.history.series(name)
        assert sorted(series) == [0, 1] and all(len(points) == 20 for points in series.values())
    assert r.state.history.series("loss")[1][-1] == (20.0, 1.05)
    text = chart.text.value
    assert (
        "<b>loss</b>" in text and "rank 0: 20 pts, last 0.05" in text and "rank 1: 20 pts, last 1.05" in text
    )
    assert chart.mime_png()["image/png"].startswith("iVBORw0KGgo")  # base64 of the PNG signature


def test_redraws_are_throttled_and_the_final_state_is_always_drawn():
    r = _reporter(min_interval=0.0)
    r.chart.interval = 3600  # no time-based redraw during the test
    for step in range(200):
        r.handle(Metrics(0, {"loss": float(step)}, step))
    assert r.chart.renders == 1  # the first point draws; the next 199 wait for the interval
    r.finish(True)
    assert r.chart.renders == 2
    assert "rank 0: 200 pts, last 199" in r.chart.text.value


def test_without_matplotlib_the_values_are_text(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an environment without matplotlib
    r = _reporter(1)
    r.handle(Metrics(0, {"loss": 0.75}, 0))
    r.handle(Metrics(0, {"loss": 0.5}, 1))
    r.finish(True)
    assert r.chart.png is None and r.chart.image.layout.display == "none"
    assert "rank 0: 2 pts, last 0.5" in r.chart.text.value
    assert "pip install matplotlib for live curves" in r.chart.text.value
    assert r.chart.mime_png() == {}


def test_one_point_per_rank_is_no_curve_and_draws_no_chart():
    """A launch that logged once per rank (the quickstart's first run) shows no chart: the rows carry the value."""
    r = _reporter(2)
    r.handle(Metrics(0, {"loss": 0.9}, 48))
    r.handle(Metrics(1, {"loss": 0.8}, 48))
    r.finish(True)
    assert r.chart.png is None and r.chart.image.layout.display == "none" and r.chart.text.value == ""
    assert r.chart.mime_png() == {}
    assert "step 48: loss=0.9" in r.infos[0].value
    r2 = _reporter(1)
    r2.handle(Metrics(0, {"loss": 0.9}, 1))
    r2.handle(Metrics(0, {"loss": 0.7}, 2))  # the second point makes a curve
    r2.finish(True)
    assert r2.chart.png is not None and r2.chart.png.startswith(PNG) and r2.chart.image.layout.display is None


def test_the_chart_text_line_shows_the_same_latest_value_as_the_row():
    """The picture is redrawn at most once a second; the text line under it follows every flush."""
    r = _reporter(1, min_interval=0.0)
    r.chart.interval = 3600.0  # the picture's clock never allows a second drawing in this test
    r.handle(Metrics(0, {"loss": 1.141}, 10))
    r.handle(Metrics(0, {"loss": 0.5}, 11))
    r.tick()
    for step in range(12, 35):
        r.handle(Metrics(0, {"loss": 1.0 / step}, step))
    r.tick()
    assert "step 34: loss=0.02941" in r.infos[0].value, r.infos[0].value
    assert "last 0.02941" in r.chart.text.value, r.chart.text.value
    r.finish(True)


def test_a_slow_matplotlib_import_does_not_hold_the_next_picture_back(monkeypatch):
    """Issue 41, item 4: the live curves lagged (epoch 0 drawn while epoch 2 trained). The next redraw
    waits the interval plus 4x the drawing time, and the first picture's matplotlib import (seconds in a
    fresh kernel) was counted as drawing time, holding the picture back for ten seconds and more."""
    import time

    from accel_nb.notebook.live import metric_chart

    slow_import = 2.0
    monkeypatch.setattr(metric_chart, "_import_matplotlib", lambda: time.sleep(slow_import))
    chart = metric_chart.MetricChart(interval=1.0)
    history = MetricHistory()
    history.add(0, {"loss": 1.0}, x=1)
    history.add(0, {"loss": 0.5}, x=2)
    start = time.monotonic()
    assert chart.update(history, now=start)  # the first picture
    drawing = time.monotonic() - start - slow_import  # what rendering took, at most
    history.add(0, {"loss": 0.25}, x=3)
    # due once the interval and 4x the drawing time have passed, whatever the import took
    assert chart.update(history, now=start + chart.interval + 4 * drawing + 0.01)


def test_an_interrupt_while_drawing_leaves_the_points_for_the_final_picture(monkeypatch):
    """The kernel's main thread draws the curves, so an interrupt (KeyboardInterrupt) can land inside
    matplotlib. The points it was drawing must stay pending: the final picture and line show them
    (seen on Colab's stack: an interrupted launch's line stayed at step 6 of 24)."""
    from accel_nb.notebook.live import metric_chart

    r = _reporter(1)
    for n in range(1, 4):
        r.handle(Progress(0, "train", n, 10, {"loss": 1.0 / n}, "train", 10.0, False))
    real = metric_chart.render_png
    interrupted = []

    def render(history, *args, **kwargs):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # the ■ button while matplotlib draws
        return real(history, *args, **kwargs)

    monkeypatch.setattr(metric_chart, "render_png", render)
    with pytest.raises(KeyboardInterrupt):
        r.chart.update(r.state.history, force=True)
    r.finish(False, "interrupted")
    assert interrupted and bytes(r.chart.image.value).startswith(PNG)
    assert "rank 0: 3 pts, last 0.3333 at step 3" in r.chart.text.value, r.chart.text.value
