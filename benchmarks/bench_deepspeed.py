"""DeepSpeed ZeRO-2/3 through Accelerator.prepare vs DeepSpeed used by hand and vs DDP, on 2 CPU ranks.

2 gloo processes (DS_ACCELERATOR=cpu, deepspeed without compiled ops) train a small MLP stack with
AdamW and gradient clipping; per configuration: the median step time and the bytes each rank holds
(parameters + optimizer state). The reference column is the same ZeRO stage through
``deepspeed.initialize`` by hand (same config, model, data and seed): the reference library cannot
run DeepSpeed on the CPU (given ``cpu=True`` it trains with DDP; see docs/deepspeed.md), so by hand is
the floor accel_nb is measured against here. A second row per stage compares with accel_nb's DDP.
Repetitions alternate which configuration goes first. Needs deepspeed (``accel_nb[deepspeed]``).

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


def _accel_nb(stage: int | None, batches: list) -> tuple[float, int]:
    """accel_nb: Accelerator(deepspeed_plugin=...) (DDP when ``stage`` is None); (median step s, bytes held)."""
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
    times = []
    for x, y in batches:
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        if stage is None:
            acc.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    module = model.module if hasattr(model, "module") else model
    held = _held_bytes(module, optimizer)
    del model, optimizer
    return statistics.median(times[3:]), held


def _by_hand(stage: int, batches: list) -> tuple[float, int]:
    """DeepSpeed by hand: ``deepspeed.initialize`` with the same config; (median step s, bytes held)."""
    import deepspeed

    engine, optimizer, *_ = deepspeed.initialize(model=_model(), model_parameters=None, config=_config(stage))
    times = []
    for x, y in batches:
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
    held = _held_bytes(engine.module, optimizer)
    del engine, optimizer
    return statistics.median(times[3:]), held


def _body(rank: int, steps: int, reps: int) -> dict[str, list[tuple[float, int]]]:  # pragma: no cover - child
    from accel_nb import PartialState

    PartialState(cpu=True)  # the gloo group every run below (accel_nb's and by hand) uses
    batches = _batches(rank, steps)
    runs = {
        "ddp": lambda: _accel_nb(None, batches),
        "zero2": lambda: _accel_nb(2, batches),
        "zero2_by_hand": lambda: _by_hand(2, batches),
        "zero3": lambda: _accel_nb(3, batches),
        "zero3_by_hand": lambda: _by_hand(3, batches),
    }
    out: dict[str, list[tuple[float, int]]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:  # alternate who goes first
            out[name].append(runs[name]())
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
        f"rank, AdamW, clipping {CLIP}; median of {steps} steps per repetition (first 3 dropped), {reps} "
        "alternating repetitions; ratio = median of per-repetition ratios"
    )
    rows = []

    def paired(a: str, b: str) -> float:
        return statistics.median(x[0] / y[0] for x, y in zip(res[a], res[b]))

    for stage in (2, 3):
        ours, hand = f"zero{stage}", f"zero{stage}_by_hand"
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"step time, ZeRO-{stage}: accel_nb prepare() vs deepspeed.initialize by hand",
                "accel_nb": statistics.median(r[0] for r in res[ours]) * 1000,
                "reference": statistics.median(r[0] for r in res[hand]) * 1000,
                "ratio": paired(ours, hand),
                "unit": "ms",
                "note": setup + "; reference column = DeepSpeed by hand (the reference library cannot run "
                "DeepSpeed on the CPU); goal ratio <= 1.0 within noise",
            }
        )
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"step time, ZeRO-{stage} vs DDP (both accel_nb)",
                "accel_nb": statistics.median(r[0] for r in res[ours]) * 1000,
                "reference": statistics.median(r[0] for r in res["ddp"]) * 1000,
                "ratio": paired(ours, "ddp"),
                "unit": "ms",
                "note": "reference column = accel_nb's DDP on the same model and data (clipping by clip_grad_norm_)",
            }
        )
        rows.append(
            {
                "benchmark": "deepspeed_cpu_2proc",
                "metric": f"bytes held per rank (parameters + optimizer state), ZeRO-{stage} vs DDP",
                "accel_nb": res[ours][0][1] / 2**20,
                "reference": res["ddp"][0][1] / 2**20,
                "ratio": res[ours][0][1] / res["ddp"][0][1],
                "unit": "MiB",
                "note": f"rank 0; by hand the same stage holds {res[hand][0][1] / 2**20:.2f} MiB",
            }
        )
    return rows


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=1))
