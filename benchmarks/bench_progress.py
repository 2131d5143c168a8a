"""Cost of live progress on the rank: ``accel_nb.progress`` inside a launch vs no progress, vs tqdm.

Inside a launch every ``Progress`` event is pickled and written to a pipe (the launcher's real
``EventWriter``), drained by a reader thread standing in for the parent. Measured:
- a loop of 100k tiny steps: time with progress / time without (and the same for tqdm writing to
  /dev/null, what users of the reference library use for progress);
- a small CPU training loop (MLP + SGD): steps/s with progress on / off (goal >= 0.98);
- the parent side: ``WidgetReporter.handle`` cost per event and widget syncs per 100k events.

    python -m benchmarks.bench_progress [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from typing import Any

from accel_nb import events


class PipeSink:
    """The rank side of the real event channel: pickled frames into a pipe a thread drains."""

    def __init__(self) -> None:
        from accel_nb.launch.channel import EventWriter

        self.read_fd, write_fd = os.pipe()
        self.writer = EventWriter(write_fd)
        self.count = 0
        self.bytes = 0
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                break
            self.bytes += len(chunk)

    def __call__(self, event: Any) -> None:
        self.count += 1
        self.writer.send(event)

    def close(self) -> None:
        self.writer.close()
        self._thread.join(5)
        os.close(self.read_fd)


def _in_launch(fn, *args):
    """Run ``fn`` with the pipe sink installed; returns (result, events sent)."""
    sink = PipeSink()
    events.set_event_sink(sink)
    try:
        return fn(*args), sink.count
    finally:
        events.set_event_sink(None)
        sink.close()


# ----------------------------------------------------------------------------- tiny steps
def loop_bare(n: int) -> float:
    t = time.perf_counter()
    x = 0.0
    for i in range(n):
        x += i * 0.5
    return time.perf_counter() - t


def loop_progress(n: int) -> float:
    from accel_nb.progress import progress

    t = time.perf_counter()
    x = 0.0
    for i in progress(range(n), desc="tiny"):
        x += i * 0.5
    return time.perf_counter() - t


def loop_tqdm(n: int) -> float | None:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    with open(os.devnull, "w") as devnull:
        t = time.perf_counter()
        x = 0.0
        for i in tqdm(range(n), desc="tiny", file=devnull):
            x += i * 0.5
        return time.perf_counter() - t


# ----------------------------------------------------------------------------- training
def _make_training():
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(64)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, data


def train_chunk(step, batches, mode: str) -> float:
    """Seconds for one pass over ``batches``; mode: off / accel_nb / tqdm."""
    t = time.perf_counter()
    if mode == "off":
        for x, y in batches:
            step(x, y)
    elif mode == "accel_nb":
        from accel_nb.progress import progress

        bar = progress(batches, desc="train")
        for x, y in bar:
            loss = step(x, y)
            bar.set_postfix(loss=loss)
    else:
        from tqdm import tqdm

        with open(os.devnull, "w") as devnull:
            bar = tqdm(batches, desc="train", file=devnull)
            for x, y in bar:
                loss = step(x, y)
                bar.set_postfix(loss=loss.item(), refresh=False)
    return time.perf_counter() - t


def train_ratios(chunk_steps: int, pairs: int) -> tuple[list[float], list[float], float]:
    """Per-pair time ratios (off / on) for accel_nb and tqdm, interleaved on the same model; steps/s off."""
    step, data = _make_training()
    batches = [data[i % len(data)] for i in range(chunk_steps)]
    train_chunk(step, batches, "off")  # warm-up
    try:
        import tqdm  # noqa: F401

        has_tqdm = True
    except ImportError:
        has_tqdm = False
    ours, ref, off_times = [], [], []
    for _ in range(pairs):
        off = train_chunk(step, batches, "off")
        on, _sent = _in_launch(train_chunk, step, batches, "accel_nb")
        off_times.append(off)
        ours.append(off / on)  # throughput on / off
        if has_tqdm:
            off2 = train_chunk(step, batches, "off")
            ref.append(off2 / train_chunk(step, batches, "tqdm"))
    return ours, ref, chunk_steps / statistics.median(off_times)


# ----------------------------------------------------------------------------- parent side
def parent_handle_cost(n_events: int) -> tuple[float, int]:
    """Seconds per ``WidgetReporter.handle`` call (no display) and widget syncs for ``n_events``."""
    from accel_nb.events import Progress
    from accel_nb.notebook.progress_widget import WidgetReporter

    rep = WidgetReporter(2, desc="bench", display=False, echo_logs=False)
    rep.start(2, {})
    before = rep.flushes
    t = time.perf_counter()
    for i in range(1, n_events + 1):
        rep.handle(Progress(i % 2, "train", i, n_events, {"loss": 1.0 / i}, "train", 1000.0, False))
    dt = time.perf_counter() - t
    syncs = rep.flushes - before
    rep.finish(True)
    return dt / n_events, syncs


def _row(metric: str, ours: float, ref: float | None, unit: str, note: str) -> dict:
    return {
        "benchmark": "progress",
        "metric": metric,
        "accel_nb": ours,
        "reference": ref,
        "ratio": (ours / ref) if ref else None,
        "unit": unit,
        "note": note,
    }


def run(quick: bool = False) -> list[dict]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    n = 100_000
    reps = 3 if quick else 7
    bare, ours, tq, sent = [], [], [], []
    for _ in range(reps):  # interleaved so drift hits all three alike
        bare.append(loop_bare(n))
        t, count = _in_launch(loop_progress, n)
        ours.append(t)
        sent.append(count)
        t_tqdm = loop_tqdm(n)
        if t_tqdm is not None:
            tq.append(t_tqdm)
    b_min, b_med = min(bare), statistics.median(bare)
    rows = []
    for label, pick, base in (("median", statistics.median, b_med), ("min", min, b_min)):
        ours_ratio = pick(ours) / base
        tq_ratio = pick(tq) / base if tq else None
        rows.append(
            _row(
                f"100k tiny steps: time with progress / without ({label})",
                ours_ratio,
                tq_ratio,
                "x",
                f"in a launch (events pickled into a pipe); reference = tqdm to /dev/null; {reps} reps; "
                f"bare loop {b_med * 1e3:.1f} ms",
            )
        )
    rows.append(
        _row(
            "100k tiny steps: added cost per step (median)",
            (statistics.median(ours) - b_med) / n * 1e9,
            (statistics.median(tq) - b_med) / n * 1e9 if tq else None,
            "ns",
            "reference = tqdm",
        )
    )
    rows.append(
        _row(
            "100k tiny steps: events sent (max over reps)",
            float(max(sent)),
            None,
            "events",
            "throttle: <= ~10/s per loop plus first and last",
        )
    )

    chunk, pairs = (200, 8) if quick else (300, 25)
    ours_t, ref_t, off_rate = train_ratios(chunk, pairs)
    rows.append(
        _row(
            "training throughput, progress on / off (median of pairs)",
            statistics.median(ours_t),
            statistics.median(ref_t) if ref_t else None,
            "x",
            f"MLP 64-256-10, batch 32, SGD, 1 thread; {pairs} interleaved off/on pairs of {chunk} steps; "
            f"set_postfix(loss) every step; off = {off_rate:.0f} steps/s; goal >= 0.98; reference = tqdm",
        )
    )

    try:
        per_event, syncs = parent_handle_cost(20_000 if quick else 100_000)
        rows.append(
            _row(
                "parent: WidgetReporter.handle per event",
                per_event * 1e6,
                None,
                "us",
                f"no display; {syncs} widget syncs for {20_000 if quick else 100_000} events fed at full speed",
            )
        )
    except ImportError:
        pass
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
