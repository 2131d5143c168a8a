"""The parent side of live progress, fed synthetic events in-process: widget models, text lines, mode choice."""

from __future__ import annotations

import io
import threading
import time

import pytest

from accel_nb.events import Dropped, Failure, Heartbeat, Log, Metrics, Phase, Progress, Result, Stacks
from accel_nb.launch.parent.launch_progress import LaunchProgress
from accel_nb.launch.parent.reporting import TextReporter
from accel_nb.notebook import display

pytest.importorskip("ipywidgets")


def _reporter(n=2, **kw):
    from accel_nb.notebook.live.progress_widget import WidgetReporter

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


def test_pending_update_is_flushed_by_tick_without_new_events():
    r = _reporter(min_interval=0.05)
    r.handle(Progress(0, "train", 1, 10))
    r.handle(Progress(0, "train", 7, 10))  # within min_interval: deferred
    assert r.bars[0].value != 7
    time.sleep(0.06)
    r.tick()  # the supervisor calls this a few times a second
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
    assert r.logs.selected_index is None  # rank 2 printed nothing: no pane opens to say "no output"
    r.finish(False, "rank 2 failed: ValueError: boom")
    # the launcher raises its LaunchError (with the tracebacks) in the cell: the box no longer repeats them
    box = r.failure_box.value
    assert "rank 2 failed: ValueError: boom (its traceback is in the error below)" in box
    assert "raise ValueError" not in box and "Traceback" not in box
    assert box.index("rank 2 failed") < box.index("rank 1 failed: RuntimeError")
    # rank 0 never returned (the launch failed elsewhere): stopped, not done
    assert "stopped" in r.statuses[0].value and r.bars[0].bar_style == "warning"
    assert "failed" in r.summary_text(False)


def test_the_failing_ranks_pane_opens_only_when_it_has_output():
    r = _reporter(2)
    r.handle(Log(1, "stdout", "loading data\n"))
    r.handle(Failure(1, "ValueError", "boom", "Traceback...\nValueError: boom\n"))
    assert r.logs.selected_index == 1  # its output may say why: opened
    r.finish(False, "rank 1 failed: ValueError: boom")
    assert "no output" in r.panes[0].value and r.logs.selected_index == 1


def test_session_start_says_ready_then_stopped_not_done():
    r = _reporter(2, idle_when_done=True)
    r.finish(True)
    for rank in (0, 1):
        assert "ready (idle)" in r.statuses[rank].value and "done" not in r.statuses[rank].value
        assert r.bars[rank].bar_style == "info"
    assert "ready (idle" in r.aggregate.value and "done" not in r.aggregate.value
    assert "ready: workers alive and idle" in r.summary_text(True)
    r.mark_session_stopped()
    for rank in (0, 1):
        assert "stopped" in r.statuses[rank].value and r.bars[rank].bar_style == "warning"
    assert "stopped" in r.aggregate.value and "ready" not in r.aggregate.value
    assert "accel_nb session stopped" in r.summary_text() and "done" not in r.summary_text()


def test_a_quiet_launch_clock_runs_from_its_start():
    r = _reporter(1, min_interval=0.0)
    r.state.started -= 3.2  # the launch began 3.2 s ago and no rank said anything since
    r.tick()
    assert "elapsed 0:03" in r.aggregate.value, r.aggregate.value
    r.finish(True)


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
    assert "Python stacks" in r.panes[1].value
    from accel_nb.notebook.widget_compat import get_titles

    assert get_titles(r.logs)[0] == "rank 0 output (1 line)"  # ipywidgets 7: set_title; 8: titles


def test_metrics_events_show_latest_values_per_rank():
    r = _reporter()
    r.handle(Metrics(1, {"loss": 0.9}, step=1))
    r.handle(Metrics(1, {"loss": 0.25, "lr": 0.001}, step=20))
    r.handle(Progress(1, "train", 3, 10, {"batch_loss": 0.5}))
    r.finish(True)
    assert "step 20: loss=0.25 lr=0.001" in r.infos[1].value and "batch_loss=0.5" in r.infos[1].value
    assert "loss" not in r.infos[0].value
    assert "batch_loss=0.5 step 20: loss=0.25 lr=0.001" in r.summary_text()


def test_stalled_rank_turns_amber_from_tick_alone_and_blue_again_when_it_moves():
    r = _reporter(stall_after=0.2, min_interval=0.0)
    r.handle(Progress(0, "train", 1, 10))
    r.handle(Progress(1, "train", 1, 10))
    time.sleep(0.3)
    r.tick()  # no event arrived: the timer alone redraws the rows
    assert r.bars[0].bar_style == "warning" and "stalled" in r.statuses[0].value
    assert "no progress for" in r.infos[0].value
    r.handle(Progress(0, "train", 2, 10))
    assert r.bars[0].bar_style == "info" and "no progress" not in r.infos[0].value
    r.finish(True)


def test_quiet_rank_says_so_and_its_rate_decays_instead_of_freezing():
    """Issue 15.3: a full bar stuck after its loop no longer reads 'running 39.8 it/s ETA 0:00' forever."""
    r = _reporter()
    r.handle(Progress(0, "train", 50, 50, rate=39.8))  # rank 0: loop finished, now stuck in a collective
    r.handle(Progress(1, "train", 20, 50, rate=39.8))  # rank 1: asleep mid-loop
    t = time.monotonic()
    assert "39.8 it/s" in r._info_html(1, t) and "no progress" not in r._info_html(1, t)
    later = r._info_html(1, t + 42)
    assert "no progress for 42 s" in later and "39.8 it/s" not in later and "ETA 0:00" not in later
    assert "no progress for 42 s" in r._info_html(0, t + 42)
    assert r.state.status(1, t + 42) == "stalled" and r.state.status(1, t + 1) == "running"
    rates = [r.state.ranks[1].rate_now(t + q) for q in (0.5, 5, 20, 60)]
    assert rates[0] == 39.8 and rates[1] > rates[2] > rates[3] and rates[3] < 39.8 / 50
    assert "79.6 it/s total" in r.state.aggregate_line(t) and "79.6" not in r.state.aggregate_line(t + 60)
    assert "(no progress for 42 s)" in r.state.rank_line(1, t + 42)
    r.finish(True)


def test_no_thread_of_its_own():
    before = {t.ident for t in threading.enumerate()}
    r = _reporter()
    r.handle(Progress(0, "train", 1, 10))
    r.handle(Heartbeat(1, time.time()))
    r.finish(True)
    assert {t.ident for t in threading.enumerate()} <= before


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
    from accel_nb.notebook.live.progress_widget import WidgetReporter

    r = WidgetReporter(2, display=False)
    r.start(2, {})
    r.handle(Log(1, "stdout", "a\nb\n"))
    r.handle(Log(0, "stderr", "oops\n"))
    r.finish(True)
    out = capsys.readouterr()
    assert out.out == "[rank 1] a\n[rank 1] b\n" and out.err == "[rank 0] oops\n"


def test_show_ranks_limits_the_echo_but_every_rank_keeps_its_pane(capsys):
    from accel_nb.notebook.live.progress_widget import WidgetReporter

    r = WidgetReporter(2, display=False, show_ranks=0)
    r.start(2, {})
    r.handle(Log(0, "stdout", "from zero\n"))
    r.handle(Log(1, "stdout", "from one\n"))
    r.finish(True)
    assert capsys.readouterr().out == "[rank 0] from zero\n"
    assert "from one" in r.panes[1].value


def _fallback_lines(err):
    return [line for line in err.splitlines() if "the progress widget could not" in line]


def test_a_widget_that_fails_to_update_hands_over_to_the_text_view(capsys):
    """The widget breaks mid-launch: one line says why, text progress and the final summary follow."""
    import ipywidgets as W
    from traitlets import validate

    from accel_nb.notebook.live.progress_widget import WidgetReporter

    class BrokenHTML(W.HTML):
        @validate("value")
        def _refuse(self, proposal):
            raise RuntimeError("the front-end went away")

    r = WidgetReporter(2, desc="train", display=False, min_interval=0.0)
    r.start(2, {})
    _run_loop(r, 0, 3)
    assert r.text_view is None and capsys.readouterr().err == ""
    r.aggregate = BrokenHTML()  # from now on every update of the widget raises
    r.handle(Progress(0, "train", 4, 10, {}, "train", 100.0, False))
    r.handle(Log(1, "stdout", "hello from one\n"))
    for i in range(5, 11):
        r.handle(Progress(0, "train", i, 10, {}, "train", 100.0, i == 10))
    r.handle(Progress(1, "train", 10, 10, {}, "train", 100.0, True))
    r.finish(True)
    out = capsys.readouterr()
    lines = _fallback_lines(out.err)
    assert lines == [
        "[accel_nb] the progress widget could not update (RuntimeError: the front-end went away); "
        "showing text progress for the rest of this launch"
    ], out.err
    assert r.text_view is not None and r.fallback_reason == "RuntimeError: the front-end went away"
    assert "[rank 1] hello from one" in out.out  # the ranks' output goes on, once
    assert out.out.count("hello from one") == 1
    assert "[rank 0] " in out.out and "10/10" in out.out  # text progress lines after the switch
    summary = out.out[out.out.index("accel_nb launch finished") :]  # the final summary, printed
    assert "rank 0 done" in summary and "rank 1 done" in summary and "10/10" in summary


def test_a_widget_that_fails_to_render_leaves_the_text_view_and_the_failure(capsys, monkeypatch):
    """The widgets cannot even be built (a missing widget feature): text from the start, failures included."""
    import ipywidgets as W

    from accel_nb.notebook.live.progress_widget import WidgetReporter

    class NoAccordion(W.Accordion):
        def __init__(self, *a, **kw):
            raise AttributeError("'Accordion' object has no attribute 'titles'")

    monkeypatch.setattr(W, "Accordion", NoAccordion)
    r = WidgetReporter(2, desc="train", display=False)
    r.start(2, {})
    r.handle(Progress(0, "train", 1, 4, {}, "train", 100.0, False))
    r.handle(Failure(1, "ValueError", "boom", "Traceback ...\nValueError: boom\n"))
    r.tick()
    r.finish(False, "rank 1 failed: ValueError: boom")
    out = capsys.readouterr()
    assert _fallback_lines(out.err) == [
        "[accel_nb] the progress widget could not render (AttributeError: 'Accordion' object has no attribute "
        "'titles'); showing text progress for the rest of this launch"
    ], out.err
    assert "[rank 1] failed: ValueError: boom" in out.err
    assert "[rank 0] " in out.out and "1/4" in out.out
    summary = out.out[out.out.index("accel_nb launch failed: 2 processes") :]  # the final summary, printed
    assert "rank 0 stopped" in summary and "rank 1 failed   ValueError: boom" in summary


# ------------------------------------------------------------------------------- text
def _text(n=2, **kw):
    buf = io.StringIO()
    rep = TextReporter(stream=buf, **kw)
    rep.start(n, {})
    return rep, buf


def test_text_reporter_prints_identical_lines_once_with_their_ranks():
    rep, buf = _text(2, merge_window=3600)
    rep.handle(Log(0, "stdout", "loading weights\nonly zero\n"))
    rep.handle(Log(1, "stdout", "loading weights\n"))
    assert buf.getvalue() == "[ranks 0,1] loading weights\n"  # "only zero" waits for rank 1
    rep.handle(Log(1, "stdout", "only one\n"))
    rep.finish(True)
    assert buf.getvalue().splitlines() == [
        "[ranks 0,1] loading weights",
        "[rank 0] only zero",
        "[rank 1] only one",
    ]


def test_a_torch_warning_every_rank_logs_is_shown_once():
    """Issue 41.5: torch's log prefix carries the rank, the time and the pid, so 4 ranks' same warning
    showed as 4 lines; it is one line now, without those parts."""
    rep, buf = _text(4, merge_window=3600)
    msg = "torch/distributed/tensor/_redistribute.py:390] While redistributing from A to B, 2 all_reduce ..."
    for rank, (t, pid) in enumerate([("06:21:38.105000", 25620), ("06:21:38.136000", 25634)] * 2):
        rep.handle(Log(rank, "stderr", f"[rank{rank}]:W1129 {t} {pid} {msg}\n"))
    rep.handle(Log(0, "stderr", "W1129 06:21:39.000000 25620 other.py:1] only rank 0\n"))
    rep.finish(True)
    assert buf.getvalue().splitlines() == [
        f"[ranks 0-3] W {msg}",
        "[rank 0] W1129 06:21:39.000000 25620 other.py:1] only rank 0",
    ]


def test_text_reporter_lone_line_waits_at_most_the_merge_window():
    rep, buf = _text(2, merge_window=0.05)
    rep.handle(Log(0, "stdout", "hello\n"))
    time.sleep(0.06)
    rep.tick()
    assert buf.getvalue() == "[rank 0] hello\n"


def test_a_flood_gives_one_note_per_rank_not_one_per_burst():
    rep, buf = _text(2)
    for count in range(100, 5000, 100):  # the rank sends its running count about once a second
        rep.handle(Dropped(0, count, "/tmp/logs/rank0.log"))
    rep.finish(True)
    notes = [line for line in buf.getvalue().splitlines() if "dropp" in line]
    assert len(notes) == 2, notes  # "dropping lines" when it starts, the total at the end
    assert "4,900" in notes[1] or "4900 lines of output dropped in all" in notes[1]
    assert "/tmp/logs/rank0.log" in notes[1]


def test_text_reporter_says_which_rank_is_quiet_and_again_as_the_silence_doubles():
    rep, buf = _text(2, stall_after=0.1)
    rep.handle(Progress(0, "train", 50, 50, rate=39.8))
    rep.handle(Progress(1, "train", 20, 50, rate=39.8))
    rep.handle(Result(0, 0))
    buf.truncate(0), buf.seek(0)
    time.sleep(0.15)
    rep.tick()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[rank 1] stalled") and "no progress for" in lines[0]
    rep._last_stall_check = 0.0
    rep.tick()
    assert len(buf.getvalue().splitlines()) == 1  # not again until the silence has doubled
    rep.finish(True)


def test_text_failure_is_one_line_and_the_summary_is_not_repeated():
    rep, buf = _text(2)
    rep.handle(Failure(1, "ValueError", "bad value\nwith a second line", "Traceback...\n"))
    rep.finish(False, "rank 1 failed: ValueError: bad value\nwith a second line")
    lines = buf.getvalue().splitlines()
    assert lines == ["[rank 1] failed: ValueError: bad value ..., stopping the other ranks"]


def test_summary_lines_cut_messages_and_say_process_in_the_singular():
    s = LaunchProgress(1)
    s.apply(Failure(0, "RuntimeError", "first line\nsecond line", "tb"))
    assert s.aggregate_line().startswith("1 rank: 1 failed")
    s.finish(False)
    lines = s.summary_lines(False, "rank 0 failed: RuntimeError: first line\nsecond line")
    assert lines[0].startswith("accel_nb launch failed: 1 process in")
    assert len(lines) == 2 and "first line ..." in lines[1] and "second line" not in "\n".join(lines)


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
    s.finish(False)  # interrupted (or a failure stopped them): the live figures describe nothing now
    agg = s.aggregate_line()
    assert agg.startswith("2 ranks: 2 stopped") and "it/s" not in agg and "ETA" not in agg, agg
    assert "elapsed" in agg


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
    assert isinstance(rep, TextReporter)
    mine = TextReporter()
    assert display.make_reporter(1, progress=mine) is mine


def test_text_progress_lines_keep_their_place_after_the_ranks_output():
    rep, buf = _text(2, merge_window=3600)
    rep.handle(Log(1, "stdout", "epoch 0 done\n"))  # waits for rank 0 to print the same
    rep.handle(Progress(1, "train", 1, 10, desc="epoch 1"))
    assert buf.getvalue() == ""  # the progress line does not jump ahead of the rank's print
    rep.finish(True)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[rank 1] epoch 0 done" and lines[1].startswith("[rank 1] epoch 1:")


def test_a_running_view_carries_its_kernel_gone_text_and_final_states_do_not():
    """The frontend marks views of a restarted kernel disconnected; CSS then shows the 'gone' text."""
    from accel_nb.notebook.live.progress_widget import GONE_CSS

    r = _reporter(1, min_interval=0.0)
    r.handle(Progress(0, "train", 3, 10))
    assert GONE_CSS in r.statuses[0].value and "stopped (kernel gone)" in r.statuses[0].value
    assert "accel-nb-live" in r.infos[0].value and "the kernel restarted or went away" in r.aggregate.value
    r.finish(True)
    assert "kernel gone" not in r.statuses[0].value and "went away" not in r.aggregate.value


def test_postfix_values_of_successive_bars_keep_counting_on_the_curve():
    """Issue 41.4: 4 epochs of 40 steps were drawn on top of each other at x = 0..40."""
    s = LaunchProgress(2)
    for epoch in range(3):
        for rank in (0, 1):  # a new bar per epoch (a fresh name), the same description
            for n in (1, 20, 40):
                s.apply(
                    Progress(rank, f"bar{epoch}", n, 40, metrics={"loss": 1.0 / (epoch + 1)}, desc="train")
                )
    for rank in (0, 1):
        xs = [x for x, _ in s.history.series("loss")[rank]]
        assert xs == [1, 20, 40, 41, 60, 80, 81, 100, 120], xs  # one run of steps, in order
    # another loop (its own description) counts on its own
    s.apply(Progress(0, "eval0", 5, 10, metrics={"acc": 0.5}, desc="eval"))
    assert s.history.series("acc")[0] == [(5.0, 0.5)]


def test_the_rank_a_hang_blames_says_so_in_its_row():
    """Issue 41.10: after a hang both rows read "stopped"; only the box below named the culprit."""
    from accel_nb.launch.parent.hang_blame import HUNG_CULPRIT

    r = _reporter()
    r.handle(Progress(0, "train", 3, 10))
    r.handle(Progress(1, "train", 2, 10))
    r.handle(Phase(0, "stopped"))
    r.handle(Phase(1, "stopped"))
    r.handle(Phase(1, HUNG_CULPRIT))  # what the supervisor sends for the likely cause
    r.finish(False, "the launch hung")
    assert "hung (likely cause)" in r.statuses[1].value and "color:#c62828" in r.statuses[1].value
    assert "stopped" in r.statuses[0].value and "hung" not in r.statuses[0].value


def test_a_long_interrupt_note_is_shown_whole_and_a_cut_line_ends_at_a_word():
    """Issue 41.6: a session interrupt's note read '...a fresh one was formed on the same wo .'"""
    from accel_nb.progress_format import one_line

    note = (
        "cell 4 interrupted: the process group was broken (rank 0 was stopped inside all_reduce) and a fresh "
        "one was formed on the same workers: their namespaces are kept and collectives work again; model "
        "now synchronise over the new group (re-bound)"
    )
    r = _reporter()
    r.handle(Progress(0, "train", 3, 10))
    r.handle(Stacks(0, 'Thread 0x1 (most recent call first):\n  File "cell", line 4 in train'))
    r.finish(False, note)
    assert note in r.failure_box.value and "(re-bound). Each rank's Python stack" in r.failure_box.value
    cut = one_line(note, limit=120)
    assert cut.endswith(" ...") and cut[:-4] == note[: len(cut) - 4] and note[len(cut) - 4] == " ", cut
