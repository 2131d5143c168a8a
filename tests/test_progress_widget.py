"""The parent side of live progress, fed synthetic events in-process: widget models, text lines, mode choice."""

from __future__ import annotations

import io
import threading
import time

import pytest

from accel_nb.events import Failure, Log, Metrics, Phase, Progress, Result, Stacks
from accel_nb.notebook import display
from accel_nb.notebook.progress_text import LaunchProgress, ProgressTextFormatter

pytest.importorskip("ipywidgets")


def _reporter(n=2, **kw):
    from accel_nb.notebook.progress_widget import WidgetReporter

    r = WidgetReporter(n, desc="train", display=False, echo_logs=False, **kw)
    r.start(n, {"launch_id": "abc123"})
    return r


def _run_loop(r, rank, total, metrics=None):
    for i in range(1, total + 1):
        r.handle(Progress(rank, "train", i, total, metrics or {}, "train", 1000.0, i == total))


def test_rows_bars_and_final_success():
    r = _reporter()
    import ipywidgets as W

    assert isinstance(r.widget, W.VBox)
    assert len(r.rows_box.children) == 2 and all(isinstance(b, W.IntProgress) for b in r.bars.values())
    assert "abc123" in r.title.value and "2 processes" in r.title.value
    _run_loop(r, 0, 100, {"loss": 0.5})
    _run_loop(r, 1, 80)
    r.handle(Result(0, 0))
    r.handle(Result(1, 1))
    r.finish(True)
    assert (r.bars[0].value, r.bars[0].max, r.bars[0].bar_style) == (100, 100, "success")
    assert (r.bars[1].value, r.bars[1].max, r.bars[1].bar_style) == (80, 80, "success")
    assert "done" in r.statuses[0].value and "loss=0.5" in r.infos[0].value and "100/100" in r.infos[0].value
    assert "2 done" in r.aggregate.value
    assert r.failure_box.layout.display == "none"
    text = r.summary_text()
    assert text.startswith("accel_nb launch finished: 2 processes")
    assert "rank 0 done" in text and "100/100" in text and "rank 1 done" in text


def test_updates_are_coalesced_but_final_state_flushed():
    r = _reporter(min_interval=3600)  # no time-based flush during the test
    before = r.flushes
    _run_loop(r, 0, 10_000)
    # only the status change (starting -> running) flushes; 10k events do not mean 10k syncs
    assert r.flushes - before <= 3
    assert r.bars[0].value < 10_000
    r.finish(True)
    assert r.bars[0].value == 10_000 and r.bars[0].bar_style == "success"


def test_pending_update_is_flushed_by_the_ticker_without_new_events():
    r = _reporter(min_interval=0.05)
    r.handle(Progress(0, "train", 1, 10))
    r.handle(Progress(0, "train", 7, 10))  # within min_interval: deferred
    deadline = time.monotonic() + 10
    while r.bars[0].value != 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.bars[0].value == 7
    r.finish(True)


def test_failure_turns_the_rank_red_and_shows_its_traceback_first():
    r = _reporter(3)
    _run_loop(r, 0, 10)
    r.handle(Log(0, "stdout", "rank0 line\n" * 50))
    r.handle(Progress(2, "train", 3, 10))
    tb = 'Traceback (most recent call last):\n  File "<cell>", line 3, in fn\n    raise ValueError("boom")\nValueError: boom\n'
    r.handle(Failure(2, "ValueError", "boom", tb))
    r.handle(Failure(1, "RuntimeError", "stopped", "Traceback...\nRuntimeError: stopped\n"))
    assert r.bars[2].bar_style == "danger" and "failed: ValueError" in r.statuses[2].value
    box = r.failure_box.value
    assert r.failure_box.layout.display is None  # visible
    assert box.index("rank 2 failed: ValueError: boom") < box.index("rank 1 failed: RuntimeError")
    assert "raise ValueError(&quot;boom&quot;)" in box or 'raise ValueError("boom")' in box
    assert r.logs.selected_index == 2  # the failing rank's pane is the one opened
    r.finish(False, "rank 2 failed: ValueError: boom")
    # rank 0 never returned (the launch failed elsewhere): stopped, not done
    assert "stopped" in r.statuses[0].value and r.bars[0].bar_style == "warning"
    assert "failed" in r.summary_text(False)


def test_interrupted_or_hung_launch_says_why_without_a_failing_rank():
    r = _reporter()
    r.handle(Progress(0, "train", 3, 10))
    r.handle(Stacks(1, 'Thread 0x1 (most recent call first):\n  File "cell", line 4 in train'))
    r.finish(False, "rank 1 failed: Hang: no progress for 5 s; it was stopped")
    assert r.failure_box.layout.display is None
    assert "Hang: no progress for 5 s" in r.failure_box.value and "output pane" in r.failure_box.value
    assert "stopped" in r.statuses[0].value and "stopped" in r.statuses[1].value
    assert "line 4 in train" in r.panes[1].value
    assert "rank 1 failed: Hang" in r.summary_text(False, "rank 1 failed: Hang")


def test_log_panes_hold_each_ranks_output_with_stderr_marked():
    r = _reporter()
    r.handle(Log(0, "stdout", "hello <b>0</b>\n"))
    r.handle(Log(1, "stderr", "warning from 1\n"))
    r.handle(Stacks(1, "Thread 1:\n  File x"))
    r.finish(True)
    assert "hello &lt;b&gt;0&lt;/b&gt;" in r.panes[0].value and "warning" not in r.panes[0].value
    assert "warning from 1" in r.panes[1].value and "color:#b71c1c" in r.panes[1].value
    assert "Python stacks (hang watchdog)" in r.panes[1].value
    assert r.logs.titles[0] == "rank 0 output (1 line)"


def test_metrics_events_show_latest_values_per_rank():
    r = _reporter()
    r.handle(Metrics(1, {"loss": 0.9}, step=1))
    r.handle(Metrics(1, {"loss": 0.25, "lr": 0.001}, step=20))
    r.handle(Progress(1, "train", 3, 10, {"batch_loss": 0.5}))
    r.finish(True)
    assert "step 20: loss=0.25 lr=0.001" in r.infos[1].value and "batch_loss=0.5" in r.infos[1].value
    assert "loss" not in r.infos[0].value
    assert "batch_loss=0.5 step 20: loss=0.25 lr=0.001" in r.summary_text()


def test_stalled_rank_turns_amber():
    r = _reporter(stall_after=0.2)
    r.handle(Progress(0, "train", 1, 10))
    r.handle(Progress(1, "train", 1, 10))
    deadline = time.monotonic() + 10
    while r.bars[0].bar_style != "warning" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.bars[0].bar_style == "warning" and "stalled" in r.statuses[0].value
    r.handle(Progress(0, "train", 2, 10))
    deadline = time.monotonic() + 10
    while r.bars[0].bar_style != "info" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.bars[0].bar_style == "info"  # moving again: blue within min_interval
    r.finish(True)


def test_ticker_thread_stops_when_quiet_and_restarts_with_events():
    r = _reporter(stall_after=0.1)
    r.handle(Progress(0, "train", 1, 10))
    first = r._ticker
    assert first is not None and first.is_alive()
    first.join(10)
    assert not first.is_alive() and r._ticker is None, "no thread left behind by a quiet launch"
    assert "stalled" in r.statuses[0].value  # it showed the stall before stopping
    r.handle(Progress(0, "train", 2, 10))
    second = r._ticker
    assert second is not None and second is not first and second.is_alive()
    r.finish(True)
    second.join(10)
    assert not second.is_alive()


def test_nested_loops_show_the_outer_one_next_to_the_bar():
    r = _reporter()
    for epoch in range(2):
        for i in range(1, 11):
            r.handle(Progress(0, f"step{epoch}", i, 10, desc="steps", done=i == 10))
        r.handle(Progress(0, "epochs", epoch + 1, 3, desc="epoch"))
    r.handle(Progress(0, "step2", 4, 10, desc="steps"))
    r.finish(True)
    assert (r.bars[0].value, r.bars[0].max) == (4, 10)
    info = r.infos[0].value
    assert "epoch 2/3" in info and "steps <b>4/10</b>" in info
    assert "step0" not in info and "step1" not in info  # finished inner loops are not listed


def test_unexpected_rank_gets_a_row():
    r = _reporter(1)
    r.handle(Progress(1, "train", 5, 10))
    r.finish(True)
    assert len(r.rows_box.children) == 2 and r.bars[1].value == 5


def test_handle_is_thread_safe():
    r = _reporter(4, min_interval=0.0)
    errors = []

    def feed(rank):
        try:
            _run_loop(r, rank, 500)
            r.handle(Log(rank, "stdout", f"bye {rank}\n"))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=feed, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r.finish(True)
    assert errors == []
    assert [r.bars[k].value for k in range(4)] == [500] * 4


def test_echo_logs_writes_whole_prefixed_lines(capsys):
    from accel_nb.notebook.progress_widget import WidgetReporter

    r = WidgetReporter(2, display=False)
    r.start(2, {})
    r.handle(Log(1, "stdout", "a\nb\n"))
    r.handle(Log(0, "stderr", "oops\n"))
    r.finish(True)
    out = capsys.readouterr()
    assert out.out == "[rank 1] a\n[rank 1] b\n" and out.err == "[rank 0] oops\n"


def test_show_ranks_limits_the_echo_but_every_rank_keeps_its_pane(capsys):
    from accel_nb.notebook.progress_widget import WidgetReporter

    r = WidgetReporter(2, display=False, show_ranks=0)
    r.start(2, {})
    r.handle(Log(0, "stdout", "from zero\n"))
    r.handle(Log(1, "stdout", "from one\n"))
    r.finish(True)
    assert capsys.readouterr().out == "[rank 0] from zero\n"
    assert "from one" in r.panes[1].value


# ------------------------------------------------------------------------------- text
def test_text_formatter_throttles_progress_and_prefixes_every_line():
    fmt = ProgressTextFormatter(interval=3600)
    fmt.start(2, {})
    lines = []
    for i in range(1, 1001):
        for rank in (0, 1):
            lines += fmt.lines_for(Progress(rank, "train", i, 1000, {"loss": 0.1}, "train", 50.0, i == 1000))
    lines += fmt.lines_for(Log(1, "stdout", "x\ny\n"))
    lines += fmt.lines_for(Failure(0, "ValueError", "boom", "Traceback\nValueError: boom\n"))
    lines += fmt.finish_lines(False)
    progress_lines = [line for line in lines if "train:" in line and line.startswith("[rank")]
    assert len(progress_lines) == 4  # first + done, per rank
    assert all("\n" not in line and "\r" not in line for line in lines)
    assert any(line.startswith("[rank 0] train: 100%|") and "1000/1000" in line for line in lines)
    assert "[rank 1] x" in lines and "[rank 1] y" in lines
    assert "[rank 0] FAILED: ValueError: boom" in lines
    assert lines[-3].startswith("accel_nb launch failed: 2 processes")


def test_fallback_text_reporter_writes_whole_lines():
    buf = io.StringIO()
    r = display.FallbackTextReporter(2, stream=buf)
    r.start(2, {})
    r.handle(Progress(0, "t", 1, 2))
    r.handle(Log(1, "stdout", "hi"))
    r.handle(Progress(0, "t", 2, 2, done=True))
    r.handle(Result(0, 0))
    r.handle(Result(1, 1))
    r.finish(True)
    text = buf.getvalue()
    assert text.endswith("\n") and "[rank 1] hi\n" in text and "[rank 0] t: 100%|" in text
    assert "accel_nb launch finished: 2 processes" in text


def test_launch_progress_status_and_aggregate():
    s = LaunchProgress(2)
    assert s.status(0) == "starting"
    s.apply(Phase(0, "rendezvous"))
    assert s.status(0) == "rendezvous"
    assert s.apply(Progress(0, "train", 5, 10, rate=5.0)) is True  # status changed to running
    assert s.apply(Progress(0, "train", 6, 10, rate=5.0)) is False
    s.apply(Progress(1, "train", 2, 10, rate=1.0))
    agg = s.aggregate_line()
    assert "2 running" in agg and "6.0 it/s total" in agg and "slowest ETA 0:08" in agg


# ------------------------------------------------------------------------------- mode choice
def test_mode_is_text_outside_a_kernel_and_override_rules(monkeypatch):
    monkeypatch.delenv(display.ENV_PROGRESS, raising=False)
    assert display.resolve_progress_mode() == "text"  # pytest is not a Jupyter kernel
    assert display.resolve_progress_mode("widget") == "text"  # no frontend: honest fallback
    monkeypatch.setenv(display.ENV_PROGRESS, "text")
    assert display.resolve_progress_mode() == "text"
    monkeypatch.setenv(display.ENV_PROGRESS, "bogus")
    with pytest.raises(ValueError, match="ACCEL_NB_PROGRESS"):
        display.resolve_progress_mode()
    with pytest.raises(ValueError, match="progress="):
        display.resolve_progress_mode("fancy")


def test_make_reporter_returns_text_here_and_passes_reporters_through(monkeypatch):
    monkeypatch.delenv(display.ENV_PROGRESS, raising=False)
    rep = display.make_reporter(2, desc="x")
    assert hasattr(rep, "start") and hasattr(rep, "handle") and hasattr(rep, "finish")
    assert type(rep).__name__ != "WidgetReporter"
    mine = display.FallbackTextReporter(1)
    assert display.make_reporter(1, progress=mine) is mine
