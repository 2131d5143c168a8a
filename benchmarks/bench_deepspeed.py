"""DeepSpeed ZeRO-2/3 through Accelerator.prepare vs DeepSpeed used by hand and vs DDP, on 2 CPU ranks.

2 gloo processes (DS_ACCELERATOR=cpu, deepspeed without compiled ops) train a small MLP stack with
AdamW and gradient clipping; per configuration: the median step time and the bytes each rank holds
(parameters + optimizer state). The reference column is the same ZeRO stage through
``deepspeed.initialize`` by hand (same config, model, data and seed): the reference library cannot
run DeepSpeed on the CPU (given ``cpu=True`` it trains with DDP; see docs/deepspeed.md), so by hand is
the floor accel_nb is measured against here. The engines of a stage (accel_nb's, by hand, and a
second by hand as a control for the measurement's own noise) live side by side and step in turn on
each batch (who goes first rotates), so all meet the same load of a shared machine; the ratio is
the median of the step-by-step ratios. Another row per stage compares with accel_nb's DDP. Needs deepspeed (``accel_nb[deepspeed]``).

    python -m benchmarks run deepspeed [--quick]
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed (the ranks are forked)

import torch  # noqa: E402

from .rank_pool import run_on_ranks  # noqa: E402

WORLD = 2
WIDTH, DEPTH, BATCH, LR, CLIP = 256, 4, 32, 1e-4, 1.0


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))


def _config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},
    }


def _held_bytes(module: torch.nn.Module, optimizer: object) -> int:
    """Bytes of parameters (ZeRO-3's local partitions where partitioned) and optimizer state on this rank."""
    params = sum(
        (lambda t: t.numel() * t.element_size())(getattr(p, "ds_tensor", p)) for p in module.parameters()
    )
    inner = optimizer
    for _ in range(3):  # accel_nb's wrapper -> DeepSpeed's ZeRO optimizer -> the torch optimizer it drives
        state = getattr(inner, "state", None)
        if isinstance(state, dict) and state and all(isinstance(v, dict) for v in state.values()):
            break
        inner = getattr(inner, "optimizer", inner)
    state = getattr(inner, "state", {}) or {}
    opt = sum(
        t.numel() * t.element_size()
        for s in state.values()
        if isinstance(s, dict)
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    return params + opt


def _batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(steps)
    ]


def _accel_nb(stage: int | None) -> tuple[object, object, object]:
    """accel_nb: Accelerator(deepspeed_plugin=...) (DDP when ``stage`` is None): (one training step, the
    module, the prepared optimizer)."""
    from accel_nb import Accelerator
    from accel_nb.deepspeed import DeepSpeedPlugin, DummyOptim
    from accel_nb.state import _reset_all_states

    _reset_all_states()
    if stage is None:
        acc = Accelerator(cpu=True)
        model = _model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    else:
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=_config(stage)))
        model = _model()
        optimizer = DummyOptim(model.parameters(), lr=LR)
    model, optimizer = acc.prepare(model, optimizer)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        if stage is None:
            acc.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()

    return step, (model.module if hasattr(model, "module") else model), optimizer


def _by_hand(stage: int) -> tuple[object, object, object]:
    """DeepSpeed by hand: ``deepspeed.initialize`` with the same config: (one training step, module, optimizer)."""
    import deepspeed

    engine, optimizer, *_ = deepspeed.initialize(model=_model(), model_parameters=None, config=_config(stage))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()

    return step, engine.module, optimizer


def _paired(runs: dict[str, tuple], batches: list, rep: int) -> dict[str, dict]:
    """Step the runs in turn, batch after batch (who goes first rotates every step, so all of them meet the
    same machine load); per run: the step times ("wall"), the main thread's CPU time per step ("cpu"; the
    work this process did, waits for the other rank and for a core left out), first 3 steps dropped, and
    the bytes it holds."""
    names = list(runs)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for i, (x, y) in enumerate(batches):
        k = (i + rep) % len(names)
        for name in names[k:] + names[:k]:
            start, cpu_start = time.perf_counter(), time.thread_time()
            runs[name][0](x, y)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.thread_time() - cpu_start)
    return {
        name: {
            "wall": wall[name][3:],
            "cpu": cpu[name][3:],
            "bytes": _held_bytes(runs[name][1], runs[name][2]),
        }
        for name in names
    }


def _body(rank: int, steps: int, reps: int) -> dict[str, list[dict]]:  # pragma: no cover - child
    from accel_nb import PartialState

    PartialState(cpu=True)  # the gloo group every run below (accel_nb's and by hand) uses
    batches = _batches(rank, steps)
    out: dict[str, list[dict]] = {}
    for rep in range(reps):
        groups = [[("ddp", lambda: _accel_nb(None))]]
        for stage in (2, 3):
            trio = [
                (f"zero{stage}", lambda s=stage: _accel_nb(s)),
                (f"zero{stage}_by_hand", lambda s=stage: _by_hand(s)),
                (f"zero{stage}_by_hand_again", lambda s=stage: _by_hand(s)),  # the control: same as by hand
            ]
            k = rep % len(trio)
            groups.append(trio[k:] + trio[:k])  # who is built first rotates too
        for group in groups:
            runs = {name: build() for name, build in group}
            for name, result in _paired(runs, batches, rep).items():
                out.setdefault(name, []).append(result)
            del runs
    return out


def run(quick: bool = False) -> list[dict]:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return [
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": "skipped: deepspeed is not installed (pip install 'accel_nb[deepspeed]')",
                "accel_nb": None,
                "reference": None,
                "ratio": None,
                "unit": "",
                "note": "",
            }
        ]
    steps, reps = (10, 2) if quick else (30, 4)
    res = run_on_ranks(_body, (steps, reps), WORLD, "the DeepSpeed benchmark", timeout=1800)
    setup = (
        f"{WORLD} gloo processes (DS_ACCELERATOR=cpu), {DEPTH} MLP blocks of width {WIDTH}, batch {BATCH} per "
        f"rank, AdamW, clipping {CLIP}; {steps} steps per repetition (first 3 dropped), {reps} repetitions"
    )
    rows = []

    def median_ms(name: str, key: str = "wall") -> float:
        return statistics.median(t for r in res[name] for t in r[key]) * 1000

    def per_step(a: str, b: str, key: str = "wall") -> float:
        """Median of the step-by-step ratios: both engines stepped in turn on the same batches."""
        return statistics.median(
            x / y for ra, rb in zip(res[a], res[b]) for x, y in zip(ra[key], rb[key]) if y > 0
        )

    def per_rep(a: str, b: str) -> float:
        return statistics.median(
            statistics.median(ra["wall"]) / statistics.median(rb["wall"]) for ra, rb in zip(res[a], res[b])
        )

    for stage in (2, 3):
        ours, hand = f"zero{stage}", f"zero{stage}_by_hand"
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"step time, ZeRO-{stage}: accel_nb prepare() vs deepspeed.initialize by hand",
                "accel_nb": median_ms(ours),
                "reference": median_ms(hand),
                "ratio": per_step(ours, hand),
                "unit": "ms",
                "note": setup + "; the engines live side by side and step in turn on each batch (who goes "
                "first rotates), ratio = median of the step-by-step ratios; reference column = DeepSpeed by "
                "hand (the reference library cannot run DeepSpeed on the CPU); goal ratio <= 1.0 within noise",
            }
        )
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"step time, ZeRO-{stage}: by hand vs by hand again (the measurement's noise)",
                "accel_nb": median_ms(hand + "_again"),
                "reference": median_ms(hand),
                "ratio": per_step(hand + "_again", hand),
                "unit": "ms",
                "note": "a third engine, built by hand like the reference column and stepped in turn with the "
                "two above: a ratio this far from 1.0 is noise, not a difference between the paths",
            }
        )
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"main-thread CPU time per step, ZeRO-{stage}: accel_nb vs by hand",
                "accel_nb": median_ms(ours, "cpu"),
                "reference": median_ms(hand, "cpu"),
                "ratio": per_step(ours, hand, "cpu"),
                "unit": "ms",
                "note": "the same steps as the step-time row, time.thread_time: the work each path makes this "
                "process do, little moved by the machine's load (waits are not counted); by hand vs by hand "
                f"again: {per_step(hand + '_again', hand, 'cpu'):.3f}",
            }
        )
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"step time, ZeRO-{stage} vs DDP (both accel_nb)",
                "accel_nb": median_ms(ours),
                "reference": median_ms("ddp"),
                "ratio": per_rep(ours, "ddp"),
                "unit": "ms",
                "note": "reference column = accel_nb's DDP on the same model and data (clipping by clip_grad_norm_), "
                "run just before each repetition's DeepSpeed pairs; ratio = median of per-repetition ratios",
            }
        )
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"bytes held per rank (parameters + optimizer state), ZeRO-{stage} vs DDP",
                "accel_nb": res[ours][0]["bytes"] / 2**20,
                "reference": res["ddp"][0]["bytes"] / 2**20,
                "ratio": res[ours][0]["bytes"] / res["ddp"][0]["bytes"],
                "unit": "MiB",
                "note": f"rank 0; by hand the same stage holds {res[hand][0]['bytes'] / 2**20:.2f} MiB",
            }
        )
    return rows


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=1))
