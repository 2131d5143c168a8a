"""DP, FSDP, tensor parallel × FSDP and pipeline parallel on 4 CPU ranks: step time and bytes per rank.

4 gloo processes train the same stack of residual MLP blocks on the same global batch, one layout after the other in the same processes, alternating the order across repetitions:
DDP, FSDP2 (one unit per block), ``ParallelismConfig(dp_shard_size=2, tp_size=2)`` with a plan, and a
4-stage pipeline (``PipelineTrainer``, 1F1B, 4 microbatches). The reference column is accel_nb's DDP
(the reference library runs none of the other layouts on CPU processes: see docs/parallelism.md and
docs/pipeline.md). Figures on a 2-core machine say how the layouts compare in overhead, not what they
gain on GPUs, where the split is what lets a model fit.

    python -m benchmarks run parallel [--quick]
"""

from __future__ import annotations

import statistics
import time

import torch

from .rank_pool import run_on_ranks

WORLD = 4
GLOBAL_BATCH, WIDTH, DEPTH = 64, 512, 4
LAYOUTS = ("ddp", "fsdp", "tp_x_fsdp", "pp")
TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Stack(torch.nn.Module):
    """DEPTH residual MLP blocks and a head: a tensor-parallel plan splits each block's two layers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = torch.nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(GLOBAL_BATCH, WIDTH, generator=g), torch.randn(GLOBAL_BATCH, 1, generator=g))
        for _ in range(steps)
    ]


def _accelerated(layout: str, rank: int, batches: list) -> tuple[float, int]:
    """(median step s, parameter bytes this rank holds) for ddp / fsdp / tp_x_fsdp through prepare()."""
    from accel_nb import Accelerator, FSDPOptions, ParallelismConfig
    from accel_nb.fsdp.sharding import local_shard_bytes
    from accel_nb.state import _reset_all_states

    _reset_all_states()
    kwargs: dict = {"cpu": True}
    if layout == "fsdp":
        kwargs["fsdp"] = FSDPOptions(auto_wrap_classes=["Block"])
    elif layout == "tp_x_fsdp":
        kwargs["parallelism_config"] = ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan=TP_PLAN)
    acc = Accelerator(**kwargs)
    model = Stack()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = acc.prepare(model, optimizer)
    # the same global batch: each data-parallel group reads its own slice of it
    per_group = GLOBAL_BATCH // (2 if layout == "tp_x_fsdp" else WORLD)
    index = acc.data_parallel_shard_rank if layout == "tp_x_fsdp" else rank
    times = []
    for x, y in batches:
        x, y = x[index * per_group : (index + 1) * per_group], y[index * per_group : (index + 1) * per_group]
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    held = local_shard_bytes(model.parameters())
    del model, optimizer
    return statistics.median(times[2:]), held


def _pipeline(batches: list) -> tuple[float, int]:
    """(median step s, parameter bytes of this rank's stage) for a 4-stage 1F1B pipeline."""
    from accel_nb import PipelineTrainer

    trainer = PipelineTrainer(
        Stack(),
        loss_fn=torch.nn.functional.mse_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
        example_args=(batches[0][0],),
        n_microbatches=4,
        schedule="1f1b",
    )
    times = []
    for x, y in batches:
        start = time.perf_counter()
        trainer.step(x, target=y)
        times.append(time.perf_counter() - start)
    held = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    return statistics.median(times[2:]), held


def _body(rank: int, steps: int, reps: int) -> dict:  # pragma: no cover - runs in the ranks
    from accel_nb import PartialState

    PartialState(cpu=True)
    batches = _batches(steps)
    full = sum(p.numel() * p.element_size() for p in Stack().parameters())
    runs = {
        name: (lambda name=name: _pipeline(batches) if name == "pp" else _accelerated(name, rank, batches))
        for name in LAYOUTS
    }
    out: dict = {"full": full, **{name: [] for name in LAYOUTS}}
    for rep in range(reps):
        for name in LAYOUTS if rep % 2 == 0 else LAYOUTS[::-1]:  # alternate who goes first
            out[name].append(runs[name]())
    return out


def run(quick: bool = False) -> list[dict]:
    steps, reps = (6, 1) if quick else (12, 3)
    res = run_on_ranks(_body, (steps, reps), WORLD, "the parallelism benchmark", timeout=1800)
    setup = (
        f"{WORLD} gloo processes on CPU, {DEPTH} residual MLP blocks of width {WIDTH} and a head (tensor "
        f"plan: each block's up colwise, down rowwise), global batch {GLOBAL_BATCH}, AdamW; median of {steps} steps (first 2 dropped) per repetition, "
        f"{reps} alternating repetitions, rank 0; reference column = accel_nb's DDP"
    )
    ddp_time = statistics.median(r[0] for r in res["ddp"])
    rows = []
    labels = {
        "fsdp": "FSDP2",
        "tp_x_fsdp": "tensor parallel 2 x FSDP 2",
        "pp": "pipeline, 4 stages (1F1B, 4 microbatches)",
    }
    for name in ("fsdp", "tp_x_fsdp", "pp"):
        ours = statistics.median(r[0] for r in res[name])
        paired = statistics.median(a[0] / b[0] for a, b in zip(res[name], res["ddp"]))
        rows.append(
            {
                "benchmark": "parallel_cpu_4proc",
                "metric": f"step time, {labels[name]} vs DDP",
                "accel_nb": ours * 1000,
                "reference": ddp_time * 1000,
                "ratio": paired,
                "unit": "ms",
                "note": setup + "; ratio = median of per-repetition ratios",
            }
        )
        rows.append(
            {
                "benchmark": "parallel_cpu_4proc",
                "metric": f"parameter bytes held by rank 0, {labels[name]} vs DDP",
                "accel_nb": res[name][0][1] / 2**20,
                "reference": res["ddp"][0][1] / 2**20,
                "ratio": res[name][0][1] / res["ddp"][0][1],
                "unit": "MiB",
                "note": f"the whole model: {res['full'] / 2**20:.2f} MiB",
            }
        )
    return rows


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=1))
