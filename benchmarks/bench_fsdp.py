"""FSDP (torch's fully_shard through Accelerator.prepare) vs DDP, both accel_nb, in the same processes.

CPU (always): 2 gloo processes train a small transformer-like stack (AdamW); median step time and the
parameter bytes each rank holds, FSDP vs DDP, interleaved repetitions. The reference library has no
column here: given cpu=True it trains with DDP even when handed an FSDP plugin.

GPU (2 or more CUDA GPUs): the same for a GPT-2-small-sized model (transformers.GPT2Config, no
download) in bf16, one process per GPU (NCCL cannot put two ranks on one GPU).

    python -m benchmarks.bench_fsdp [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from .rank_pool import run_on_ranks

WORLD = 2
WIDTH, DEPTH, BATCH = 256, 4, 32


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def _cpu_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[_Block() for _ in range(DEPTH)], torch.nn.Linear(WIDTH, 1))


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512))


def _one_run(use_fsdp: bool, gpu: bool, steps: int) -> tuple[float, float]:
    """(median step seconds, this rank's share of the parameter bytes) of one prepared training run."""
    from accel_nb import Accelerator, FSDPOptions
    from accel_nb.fsdp.sharding import local_shard_bytes

    wrap = ["GPT2Block"] if gpu else ["_Block"]
    acc = Accelerator(
        cpu=not gpu,
        mixed_precision="bf16" if gpu else "no",
        # CPU rows stay on CPU on a GPU machine
        fsdp=FSDPOptions(auto_wrap_classes=wrap) if use_fsdp else None,
    )
    model = _gpt2() if gpu else _cpu_model()
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    g = torch.Generator().manual_seed(acc.process_index)
    if gpu:
        ids = torch.randint(0, 50257, (8, 512), generator=g).to(acc.device)
        batch = {"input_ids": ids, "labels": ids}
    else:
        batch = {"x": torch.randn(BATCH, WIDTH, generator=g), "y": torch.randn(BATCH, 1, generator=g)}
    times = []
    for _ in range(steps):
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**batch).loss if gpu else torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    share = local_shard_bytes(model.parameters()) / full
    del model, opt
    return statistics.median(times[3:]), share


def _fsdp_and_ddp(
    rank: int, gpu: bool, steps: int, reps: int
) -> dict[str, list[tuple[float, float]]]:  # pragma: no cover
    """One rank: FSDP and DDP runs, alternating which goes first."""
    results: dict[str, list[tuple[float, float]]] = {"fsdp": [], "ddp": []}
    for rep in range(reps):
        for name in ("fsdp", "ddp") if rep % 2 == 0 else ("ddp", "fsdp"):  # alternate who goes first
            results[name].append(_one_run(name == "fsdp", gpu, steps))
    return results


def _measure(gpu: bool, world: int, steps: int, reps: int) -> dict[str, list[tuple[float, float]]]:
    return run_on_ranks(
        _fsdp_and_ddp,
        (gpu, steps, reps),
        world,
        "the FSDP benchmark",
        start_method="spawn" if gpu else "fork",
    )


def _rows(bench: str, res: dict[str, list[tuple[float, float]]], note: str) -> list[dict]:
    fsdp = [r[0] for r in res["fsdp"]]
    ddp = [r[0] for r in res["ddp"]]
    paired = statistics.median(a / b for a, b in zip(fsdp, ddp))
    return [
        {
            "benchmark": bench,
            "metric": "step time, FSDP vs DDP (median, paired ratio)",
            "accel_nb": statistics.median(fsdp) * 1000,
            "reference": statistics.median(ddp) * 1000,
            "ratio": paired,
            "unit": "ms",
            "note": note + "; reference column = accel_nb's DDP; ratio = median of per-repetition ratios",
        },
        {
            "benchmark": bench,
            "metric": "parameter bytes held per rank, FSDP vs DDP",
            "accel_nb": res["fsdp"][0][1],
            "reference": res["ddp"][0][1],
            "ratio": res["fsdp"][0][1] / res["ddp"][0][1],
            "unit": "fraction of the model",
            "note": note,
        },
    ]


def run(quick: bool = False) -> list[dict]:
    steps, reps = (10, 2) if quick else (30, 5)
    rows = _rows(
        "fsdp_cpu_2proc",
        _measure(False, WORLD, steps, reps),
        f"{WORLD} gloo processes, {DEPTH} MLP blocks of width {WIDTH} (one FSDP unit each), batch {BATCH}, AdamW; "
        f"median of {steps} steps per repetition, {reps} interleaved repetitions",
    )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        rows += _rows(
            "fsdp_gpu_gpt2_small",
            _measure(True, gpus, steps, max(reps // 2, 1)),
            f"{gpus} GPUs ({torch.cuda.get_device_name(0)}), GPT-2 small (GPT2Block units), bf16, batch 8x512 per GPU",
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    for row in run("--quick" in argv):
        print(
            f"{row['benchmark']:20s} {row['metric']:48s} accel_nb={row['accel_nb']:.4g} "
            f"reference={row['reference']:.4g} ratio={row['ratio']:.3f} {row['unit']}  ({row['note']})"
        )


if __name__ == "__main__":
    main()
