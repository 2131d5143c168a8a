"""accel_nb.progress on the rank side: events through a test sink, throttling, the text bar."""

from __future__ import annotations

import io

import pytest

import accel_nb
from accel_nb import events
from accel_nb import progress_bar as progress_module
from accel_nb.events import Progress


class FakeClock:
    """Stands in for the ``time`` module inside accel_nb.progress_bar: the test sets ``now``."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def sink():
    got: list = []
    events.set_event_sink(got.append)
    try:
        yield got
    finally:
        events.set_event_sink(None)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress_module, "time", fake)
    return fake


def _progress(got):
    return [e for e in got if isinstance(e, Progress)]


def test_public_function_and_its_module_have_different_names():
    """``from accel_nb import progress`` is the function; its module stays a plain module (issue 16)."""
    import importlib
    import types

    from accel_nb import progress

    mod = importlib.import_module("accel_nb.progress_bar")
    assert isinstance(progress, types.FunctionType) and progress is accel_nb.progress
    assert type(mod) is types.ModuleType and mod.ProgressBar is type(progress([1], disable=True))
    assert list(progress([1, 2, 3], disable=True)) == [1, 2, 3]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("accel_nb.progress")


def test_events_in_a_launch_first_and_last_and_values(sink, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    bar = accel_nb.progress(range(50), desc="train")
    seen = []
    for i in bar:
        seen.append(i)
        bar.set_postfix(loss=1.0 / (i + 1))
    got = _progress(sink)
    assert seen == list(range(50))
    assert got[0].n == 0 and got[0].total == 50 and got[0].done is False  # announced before the first step
    last = got[-1]
    assert (last.rank, last.name, last.desc, last.n, last.total, last.done) == (
        3,
        "train",
        "train",
        50,
        50,
        True,
    )
    assert last.metrics == {"loss": pytest.approx(1.0 / 50)}
    assert sum(e.done for e in got) == 1


def test_100k_steps_send_a_bounded_number_of_events(sink, clock):
    n_steps = 100_000
    bar = accel_nb.progress(range(n_steps), desc="fast")
    for i in bar:
        clock.now = 1000.0 + i * 1e-5  # 100k steps/s: the whole loop takes one (fake) second
    got = _progress(sink)
    # one second at <= 10 events/s, plus the first and the final one
    assert 3 <= len(got) <= 14, [e.n for e in got]
    assert got[-1].n == n_steps and got[-1].total == n_steps and got[-1].done
    ns = [e.n for e in got]
    assert ns == sorted(ns)
    assert clock.reads < n_steps // 10, "the clock must not be read on every step"
    assert got[-1].rate == pytest.approx(1e5, rel=0.2)


def test_slow_loop_sends_every_step_once_interval_passed(sink, clock):
    for _ in accel_nb.progress(range(5), every=0.5):
        clock.now += 1.0  # each step takes longer than `every`
    got = _progress(sink)
    assert [e.n for e in got] == [0, 1, 2, 3, 4, 5]  # the final step once, as the done event
    assert [e.done for e in got] == [False, False, False, False, False, True]


def test_every_throttles_to_the_given_interval(sink, clock):
    bar = accel_nb.progress(total=1000, every=1.0)
    for _ in range(1000):
        clock.now += 0.01  # 10 s in all
        bar.update()
    bar.close()
    got = _progress(sink)
    assert 9 <= len(got) <= 13
    assert got[-1].n == 1000 and got[-1].done


def test_manual_update_context_manager_and_set_metrics(sink):
    with accel_nb.progress(total=10, desc="eval", name="eval-loop") as bar:
        for _ in range(5):
            bar.update(2)
        bar.set_metrics({"acc": 0.5}, f1=0.25)
        assert len(bar) == 10
    last = _progress(sink)[-1]
    assert (last.name, last.n, last.done, last.metrics) == ("eval-loop", 10, True, {"acc": 0.5, "f1": 0.25})


def test_break_ends_the_loop_where_it_stopped(sink):
    for i in accel_nb.progress(range(100), desc="b", every=1000):
        if i == 41:
            break
    got = _progress(sink)
    assert got[-1].n == 41 and got[-1].done is True  # 41 steps completed (0..40)
    assert sum(e.done for e in got) == 1


def test_exception_in_body_ends_the_loop_where_it_stopped(sink):
    with pytest.raises(ValueError):
        with accel_nb.progress(total=10, desc="x") as bar:
            bar.update(3)
            raise ValueError("boom")
    with pytest.raises(KeyError):
        for i in accel_nb.progress(range(10), desc="y"):
            if i == 5:
                raise KeyError("k")
    x_events = [e for e in _progress(sink) if e.name == "x"]
    y_events = [e for e in _progress(sink) if e.name == "y"]
    assert (x_events[-1].n, x_events[-1].done) == (3, True)
    assert (y_events[-1].n, y_events[-1].done) == (5, True)


def test_tensor_metrics_become_numbers(sink):
    torch = pytest.importorskip("torch")
    bar = accel_nb.progress(range(2))
    for _ in bar:
        bar.set_postfix(loss=torch.tensor(0.5))
    assert _progress(sink)[-1].metrics == {"loss": 0.5}
    assert type(_progress(sink)[-1].metrics["loss"]) is float


def test_unknown_total_from_a_generator(sink):
    list(accel_nb.progress((i for i in range(7)), desc="gen"))
    last = _progress(sink)[-1]
    assert last.total is None and last.n == 7 and last.done


def test_outside_a_launch_draws_whole_lines_on_a_non_tty():
    assert not events.in_launch()
    buf = io.StringIO()
    bar = accel_nb.progress(range(1000), desc="local", file=buf)
    for _ in bar:
        bar.set_postfix(loss=0.25)
    text = buf.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert 1 <= len(lines) <= 3
    assert lines[-1].startswith("local: 100%|") and "1000/1000" in lines[-1] and "loss=0.25" in lines[-1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_outside_a_launch_redraws_one_line_on_a_tty(clock):
    buf = _Tty()
    for _ in accel_nb.progress(range(30), desc="tty", file=buf):
        clock.now += 0.05
    text = buf.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn with \r
    assert text.count("\r") >= 3
    assert "30/30" in text.rsplit("\r", 1)[-1]


def test_disable_emits_nothing(sink):
    assert list(accel_nb.progress(range(3), disable=True)) == [0, 1, 2]
    assert sink == []


def test_format_helpers():
    from accel_nb.progress_format import format_duration, format_progress_line, format_rate

    assert (
        format_duration(75.2) == "1:15"
        and format_duration(3725) == "1:02:05"
        and format_duration(None) == "?"
    )
    assert (
        format_rate(1234.5) == "1234 it/s"
        and format_rate(0.5) == "2.00 s/it"
        and format_rate(None) == "? it/s"
    )
    line = format_progress_line(50, 100, 10.0, {"loss": 0.123456}, "train")
    assert (
        line.startswith("train:  50%|##########          | 50/100")
        and "ETA 0:05" in line
        and "loss=0.1235" in line
    )


TQDM_SCRIPT = r"""
import io, sys
from accel_nb import events
from accel_nb.launch.rank import tqdm_bridge
got = []
events.set_event_sink(got.append)
assert tqdm_bridge.install()
import tqdm, tqdm.auto, tqdm.notebook
err = io.StringIO()
for _ in tqdm.tqdm(range(7), desc="plain", file=err):
    pass
bar = tqdm.notebook.tqdm(total=10)  # no ipywidgets bar: the plain, bridged one
bar.update(4)
bar.set_postfix(loss=0.5)
bar.close()
for _ in tqdm.auto.tqdm(range(3)):
    pass
print(err.getvalue() == "", [(e.name, e.n, e.total, e.desc, e.metrics, e.done) for e in got])
"""


def test_tqdm_bars_in_a_rank_become_progress_events():
    """In a separate process (the bridge changes tqdm's classes for good, as it does in a rank)."""
    import ast
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", TQDM_SCRIPT], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    printed_nothing, got = res.stdout.strip().split(" ", 1)
    assert printed_nothing == "True"  # tqdm drew nothing on its file
    got = ast.literal_eval(got)
    plain = [g for g in got if g[3] == "plain"]
    assert plain[0][1:3] == (0, 7) and plain[-1][1:] == (7, 7, "plain", {}, True)
    nb = [g for g in got if g[2] == 10]
    assert nb[-1][1:] == (4, 10, None, {"loss": 0.5}, True)
    assert [g for g in got if g[2] == 3][-1][1] == 3
    assert len({g[0] for g in got}) == 3  # one loop name per bar
