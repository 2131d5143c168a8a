"""Cost of live progress on the rank: ``accel_nb.progress`` inside a launch vs no progress, vs tqdm.

Inside a launch every ``Progress`` event is pickled and written to a pipe (the launcher's real
``EventWriter``), drained by a reader thread standing in for the parent. Measured:
- a loop of 100k tiny steps: time with progress / time without (and the same for tqdm writing to
  /dev/null, what users of the reference library use for progress);
- a small CPU training loop (MLP + SGD): throughput with progress on / off (goal >= 0.98);
- the same two inside a real 2-rank ``notebook_launcher`` launch (DDP over gloo for training);
- the parent side: ``WidgetReporter.handle`` cost per event and widget syncs per 100k events.

Every timing is taken on two clocks: wall time, and the CPU time of the measuring thread
(``time.thread_time``), which other processes on a busy shared machine barely disturb. Training
runs are off-on-off triples ("on" against the mean of its neighbours, so drift cancels), then
the median; an off/off control shows the noise floor of the machine at that moment.

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

Timing = tuple[float, float]  # (wall seconds, CPU seconds of this thread)


def _now() -> Timing:
    return time.perf_counter(), time.thread_time()


def _since(start: Timing) -> Timing:
    wall, cpu = _now()
    return wall - start[0], cpu - start[1]


class PipeSink:
    """The rank side of the real event channel: pickled frames into a pipe a thread drains."""

    def __init__(self) -> None:
        from accel_nb.launch.channel import EventWriter

        self.read_fd, write_fd = os.pipe()
        self.writer = EventWriter(write_fd)
        self.count = 0
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while os.read(self.read_fd, 1 << 16):
            pass

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
def loop_bare(n: int) -> Timing:
    t = _now()
    x = 0.0
    for i in range(n):
        x += i * 0.5
    return _since(t)


def loop_progress(n: int) -> Timing:
    from accel_nb import progress

    t = _now()
    x = 0.0
    for i in progress(range(n), desc="tiny"):
        x += i * 0.5
    return _since(t)


def loop_tqdm(n: int) -> Timing:
    from tqdm import tqdm

    with open(os.devnull, "w") as devnull:
        t = _now()
        x = 0.0
        for i in tqdm(range(n), desc="tiny", file=devnull):
            x += i * 0.5
        return _since(t)


def _has_tqdm() -> bool:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def tiny_ratios(n: int, reps: int) -> dict[str, list]:
    """Per-rep ratios (with / without) on both clocks, for accel_nb in a launch and for tqdm."""
    out: dict[str, list] = {"ours_wall": [], "ours_cpu": [], "tqdm_wall": [], "tqdm_cpu": [], "sent": []}
    out["bare_cpu"] = []
    tq = _has_tqdm()
    for i in range(reps):
        if i % 2:
            (ours, sent), bare = _in_launch(loop_progress, n), loop_bare(n)
        else:
            bare, (ours, sent) = loop_bare(n), _in_launch(loop_progress, n)
        out["ours_wall"].append(ours[0] / bare[0])
        out["ours_cpu"].append(ours[1] / bare[1])
        out["bare_cpu"].append(bare[1])
        out["sent"].append(sent)
        if tq:
            bare2, ref = loop_bare(n), loop_tqdm(n)
            out["tqdm_wall"].append(ref[0] / bare2[0])
            out["tqdm_cpu"].append(ref[1] / bare2[1])
    return out


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


def train_chunk(step, batches, mode: str) -> Timing:
    """One pass over ``batches``; mode: off / accel_nb / tqdm (postfix with the loss every step)."""
    t = _now()
    if mode == "off":
        for x, y in batches:
            step(x, y)
    elif mode == "accel_nb":
        from accel_nb import progress

        bar = progress(batches, desc="train")
        for x, y in bar:
            bar.set_postfix(loss=step(x, y))
    else:
        from tqdm import tqdm

        with open(os.devnull, "w") as devnull:
            bar = tqdm(batches, desc="train", file=devnull)
            for x, y in bar:
                bar.set_postfix(loss=step(x, y).item(), refresh=False)
    return _since(t)


def train_ratios(chunk_steps: int, pairs: int) -> dict[str, Any]:
    """Throughput ratios (on / off) on both clocks from off-on-off triples on the same model."""
    step, data = _make_training()
    batches = [data[i % len(data)] for i in range(chunk_steps)]
    train_chunk(step, batches, "off")  # warm-up
    tq = _has_tqdm()
    out: dict[str, Any] = {"ours_wall": [], "ours_cpu": [], "tqdm_wall": [], "tqdm_cpu": [], "off_wall": []}
    for _ in range(pairs):
        # off, on, off: "on" is compared with the mean of its two neighbours, so drift cancels
        a, (on, _sent), c = (
            train_chunk(step, batches, "off"),
            _in_launch(train_chunk, step, batches, "accel_nb"),
            train_chunk(step, batches, "off"),
        )
        out["off_wall"].append((a[0] + c[0]) / 2)
        out["ours_wall"].append((a[0] + c[0]) / 2 / on[0])
        out["ours_cpu"].append((a[1] + c[1]) / 2 / on[1])
        out.setdefault("control_cpu", []).append(a[1] / c[1])  # off / off: this machine's noise floor now
        if tq:
            a, ref, c = (
                train_chunk(step, batches, "off"),
                train_chunk(step, batches, "tqdm"),
                train_chunk(step, batches, "off"),
            )
            out["tqdm_wall"].append((a[0] + c[0]) / 2 / ref[0])
            out["tqdm_cpu"].append((a[1] + c[1]) / 2 / ref[1])
    out["steps_per_s"] = chunk_steps / statistics.median(out["off_wall"])
    return out


def progress_cost_per_step(steps: int = 200_000) -> float:
    """CPU seconds the progress API itself adds per training-loop step (iteration + set_postfix(tensor))."""
    import torch

    from accel_nb import progress

    loss = torch.tensor(0.5)
    items = list(range(steps))

    def bare() -> float:
        t = time.thread_time()
        for _ in items:
            pass
        return time.thread_time() - t

    def with_progress() -> float:
        t = time.thread_time()
        bar = progress(items, desc="train")
        for _ in bar:
            bar.set_postfix(loss=loss)
        return time.thread_time() - t

    costs = []
    for _ in range(5):
        b = bare()
        (p, _sent) = _in_launch(with_progress)
        costs.append((p - b) / steps)
    return min(costs)


# ----------------------------------------------------------------------------- a real launch
def rank_tiny_loops(n: int, reps: int) -> dict[str, list]:
    """On every rank of a real launch: bare vs progress loops (events really go to the parent)."""
    wall, cpu = [], []
    for i in range(reps):
        if i % 2:
            ours, bare = loop_progress(n), loop_bare(n)
        else:
            bare, ours = loop_bare(n), loop_progress(n)
        wall.append(ours[0] / bare[0])
        cpu.append(ours[1] / bare[1])
    return {"wall": wall, "cpu": cpu}


def rank_ddp_training(chunk: int, pairs: int) -> dict[str, list]:
    """On every rank: DDP training chunks without / with progress, interleaved; throughput ratios."""
    import torch

    from accel_nb import Accelerator, progress

    torch.manual_seed(0)
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(chunk)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def one(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        acc.backward(loss)
        opt.step()
        return loss

    def run_off() -> Timing:
        acc.wait_for_everyone()
        t = _now()
        for x, y in batches:
            one(x, y)
        return _since(t)

    def run_on() -> Timing:
        acc.wait_for_everyone()
        t = _now()
        bar = progress(batches, desc="train")
        for x, y in bar:
            bar.set_postfix(loss=one(x, y))
        return _since(t)

    run_off()  # warm-up
    wall, cpu = [], []
    for _ in range(pairs):  # off, on, off: "on" against the mean of its neighbours
        a, on, c = run_off(), run_on(), run_off()
        wall.append((a[0] + c[0]) / 2 / on[0])
        cpu.append((a[1] + c[1]) / 2 / on[1])
    return {"wall": wall, "cpu": cpu}


def in_real_launch(fn, *args) -> list:
    """``fn(*args)`` on 2 CPU ranks through notebook_launcher (events go through the real channel)."""
    from accel_nb import notebook_launcher
    from accel_nb.launch.parent.reporting import ListReporter

    return notebook_launcher(fn, args=args, num_processes=2, cpu=True, reporter=ListReporter())


# ----------------------------------------------------------------------------- parent side
def parent_handle_cost(n_events: int) -> tuple[float, int]:
    """Seconds per ``WidgetReporter.handle`` call (no display) and widget syncs for ``n_events``."""
    from accel_nb.events import Progress
    from accel_nb.notebook.live.progress_widget import WidgetReporter

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


def parent_tick_cost(calls: int) -> float:
    """Seconds per ``WidgetReporter.tick`` (what the supervisor calls between events), 2 quiet ranks."""
    from accel_nb.events import Progress
    from accel_nb.notebook.live.progress_widget import WidgetReporter

    rep = WidgetReporter(2, desc="bench", display=False, echo_logs=False)
    rep.start(2, {})
    for rank in (0, 1):
        rep.handle(Progress(rank, "train", 5, 10, {}, "train", 1000.0, False))
    t = time.perf_counter()
    for _ in range(calls):
        rep.tick()
    dt = time.perf_counter() - t
    rep.finish(True)
    return dt / calls


# ----------------------------------------------------------------------------- rows
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


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run(quick: bool = False) -> list[dict]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    n = 100_000
    reps = 5 if quick else 15
    rows = []

    tiny = tiny_ratios(n, reps)
    base = (
        f"bare loop {statistics.median(tiny['bare_cpu']) * 1e3:.1f} ms CPU; {reps} interleaved reps, median"
    )
    for clock in ("cpu", "wall"):
        rows.append(
            _row(
                f"100k tiny steps: time with progress / without ({clock})",
                _med(tiny[f"ours_{clock}"]),
                _med(tiny[f"tqdm_{clock}"]),
                "x",
                f"in a launch (events pickled into a pipe); reference = tqdm to /dev/null; {base}",
            )
        )
    rows.append(
        _row(
            "100k tiny steps: added cost per step (cpu)",
            (_med(tiny["ours_cpu"]) - 1) * statistics.median(tiny["bare_cpu"]) / n * 1e9,
            ((_med(tiny["tqdm_cpu"]) - 1) * statistics.median(tiny["bare_cpu"]) / n * 1e9)
            if tiny["tqdm_cpu"]
            else None,
            "ns",
            "reference = tqdm",
        )
    )
    rows.append(
        _row(
            "100k tiny steps: events sent (max over reps)",
            float(max(tiny["sent"])),
            None,
            "events",
            "rank-side throttle: <= ~10/s per loop, always the first and the last",
        )
    )

    chunk, pairs = (100, 10) if quick else (150, 40)
    train = train_ratios(chunk, pairs)
    for clock in ("cpu", "wall"):
        rows.append(
            _row(
                f"training throughput, progress on / off ({clock})",
                _med(train[f"ours_{clock}"]),
                _med(train[f"tqdm_{clock}"]),
                "x",
                f"MLP 64-256-10, batch 32, SGD, 1 thread; {pairs} off-on-off triples of {chunk} steps, median; "
                f"set_postfix(loss) every step; off = {train['steps_per_s']:.0f} steps/s; goal >= 0.98; "
                f"reference = tqdm; control off/off (cpu): median {_med(train['control_cpu']):.3f}, "
                f"range {min(train['control_cpu']):.2f}-{max(train['control_cpu']):.2f}",
            )
        )

    per_step = progress_cost_per_step()
    step_s = 1.0 / train["steps_per_s"]
    rows.append(
        _row(
            "training: progress cost per step / step time (cpu)",
            per_step / step_s * 100,
            None,
            "%",
            f"iteration + set_postfix(loss tensor) + throttled events: {per_step * 1e9:.0f} ns CPU per step, "
            f"measured alone; a step of this MLP takes {step_s * 1e6:.0f} us here; robust to machine load",
        )
    )

    try:
        per_rank = in_real_launch(rank_tiny_loops, n, reps)
        for clock in ("cpu", "wall"):
            ratios = [statistics.median(r[clock]) for r in per_rank]
            rows.append(
                _row(
                    f"100k tiny steps in a real 2-rank launch: with progress / without ({clock}, worst rank)",
                    max(ratios),
                    None,
                    "x",
                    f"notebook_launcher(num_processes=2, cpu=True); per rank: {', '.join(f'{x:.2f}' for x in ratios)}",
                )
            )
        ddp = in_real_launch(rank_ddp_training, chunk, pairs)
        for clock in ("cpu", "wall"):
            ratios = [statistics.median(r[clock]) for r in ddp]
            rows.append(
                _row(
                    f"DDP training in a real 2-rank launch: throughput progress on / off ({clock}, worst rank)",
                    min(ratios),
                    None,
                    "x",
                    f"gloo, MLP 64-256-10, batch 32; {pairs} off-on-off triples of {chunk} steps; goal >= 0.98; "
                    f"per rank: {', '.join(f'{x:.3f}' for x in ratios)}",
                )
            )
    except ImportError as exc:  # the launcher is not available
        rows.append(_row("real launch", float("nan"), None, "", f"skipped: {exc}"))

    n_events = 20_000 if quick else 100_000
    try:
        per_event, syncs = parent_handle_cost(n_events)
        rows.append(
            _row(
                "parent: WidgetReporter.handle per event",
                per_event * 1e6,
                None,
                "us",
                f"no display; {syncs} widget syncs for {n_events} events fed at full speed (<= 10/s by design)",
            )
        )
        rows.append(
            _row(
                "parent: WidgetReporter.tick per call",
                parent_tick_cost(20_000) * 1e6,
                None,
                "us",
                "2 quiet ranks, no display; the supervisor calls it at most ~20 times a second between events",
            )
        )
    except ImportError:  # ipywidgets not installed
        pass
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
