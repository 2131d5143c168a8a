"""Training throughput: accel_nb's prepared loop vs the same loop written by hand, in the same run.

CPU (always): 2 gloo processes train a small MLP; samples/s of accel_nb (Accelerator.prepare +
backward) vs a hand-written DistributedDataParallel + DistributedSampler loop, and vs the reference
library (accelerate) when it is installed. The implementations take turns inside the same two
processes, several repetitions each, so machine noise hits all of them alike. Goal: ratio >= 0.97.

GPU (only when CUDA is available): per-step time of a GPT-2-small-sized model (built from a
transformers GPT2Config, no download) in bf16, accel_nb vs plain PyTorch (torch.autocast) and vs
the reference library, one process. Goal: ratio <= 1.01.

    python -m benchmarks.bench_training [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from .rank_pool import run_on_ranks

CPU_WORLD = 2
CPU_BATCH = 64  # per process
CPU_FEATURES, CPU_HIDDEN, CPU_CLASSES = 128, 256, 10


# -- CPU: 2 processes ------------------------------------------------------------------------------
def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(CPU_FEATURES, CPU_HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(CPU_HIDDEN, CPU_HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(CPU_HIDDEN, CPU_CLASSES),
    )


def _cpu_dataset(steps: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    n = steps * CPU_BATCH * CPU_WORLD
    x = torch.randn(n, CPU_FEATURES, generator=g)
    y = torch.randint(0, CPU_CLASSES, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _timed_epoch(loader: Any, step_fn: Any) -> tuple[float, float]:
    """(samples/s, samples per CPU-second) of this process over one pass.

    Both come from the median interval between step ends (each interval holds the fetch of a batch
    and one training step), so a few descheduled steps on a shared machine do not move them. The
    CPU-time figure counts only this process's own work (all its threads), which makes the
    overhead of a wrapper visible even when other programs compete for the cores.
    """
    import torch.distributed as dist

    dist.barrier()
    wall, cpu = [], []
    last_wall, last_cpu = time.perf_counter(), time.process_time()
    batch = 0
    for x, y in loader:
        step_fn(x, y)
        now_wall, now_cpu = time.perf_counter(), time.process_time()
        wall.append(now_wall - last_wall)
        cpu.append(now_cpu - last_cpu)
        last_wall, last_cpu = now_wall, now_cpu
        batch = max(batch, x.shape[0])
    dist.barrier()
    return batch / statistics.median(wall), batch / max(statistics.median(cpu), 1e-9)


def _run_handwritten_ddp(dataset: Any, warmup: int) -> float:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    model = DistributedDataParallel(_mlp())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(
        dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True, seed=0
    )
    loader = DataLoader(dataset, batch_size=CPU_BATCH, sampler=sampler)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    _warm(loader, step, warmup)
    sampler.set_epoch(1)
    wall, cpu = _timed_epoch(loader, step)
    return wall * dist.get_world_size(), cpu * dist.get_world_size()


def _run_prepared(accelerator: Any, dataset: Any, warmup: int) -> tuple[float, float]:
    """One timed epoch of the same loop through an Accelerator-style ``prepare``/``backward``."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=CPU_BATCH, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    _check_ddp(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()

    _warm(loader, step, warmup)
    wall, cpu = _timed_epoch(loader, step)
    accelerator.free_memory()
    return wall * dist.get_world_size(), cpu * dist.get_world_size()


def _run_accel_nb(dataset: Any, warmup: int) -> tuple[float, float]:
    from accel_nb import Accelerator

    return _run_prepared(Accelerator(cpu=True), dataset, warmup)


def _run_reference(dataset: Any, warmup: int) -> tuple[float, float]:
    from accelerate import Accelerator as ReferenceAccelerator

    # without cpu=True the reference would not form a group on CPUs
    return _run_prepared(ReferenceAccelerator(cpu=True), dataset, warmup)


def _check_ddp(model: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise RuntimeError(f"the prepared model is a {type(model).__name__}, not DistributedDataParallel")


def _warm(loader: Any, step: Any, n: int) -> None:
    # every implementation must really be sharded over the processes (not N copies of one process)
    import torch.distributed as dist

    expected = len(loader.dataset) // (CPU_BATCH * dist.get_world_size())
    if len(loader) != expected:
        raise RuntimeError(f"{len(loader)} batches per process, expected {expected}: the loop is not sharded")
    for i, (x, y) in enumerate(loader):
        if i >= n:
            break
        step(x, y)


def _has_reference() -> bool:
    try:
        import accelerate  # noqa: F401
    except Exception:
        return False
    return True


def _cpu_runs(rank: int, steps: int, reps: int) -> dict[str, list[float]]:  # pragma: no cover - child
    """One rank: hand-written DDP, accel_nb and the reference on the same gloo group, alternating order."""
    from accel_nb.state import PartialState

    # cpu=True: these are the CPU rows, also on a GPU machine (without it the group would be NCCL and
    # the CPU model's DDP would fail: "No backend type associated with device type cpu")
    PartialState(cpu=True)  # joins the gloo group; the hand-written loop and the reference reuse it
    dataset = _cpu_dataset(steps)
    impls = {"ddp": _run_handwritten_ddp, "accel_nb": _run_accel_nb}
    if _has_reference():
        impls["reference"] = _run_reference
    results: dict[str, list[float]] = {k: [] for k in impls}
    for rep in range(reps):
        names = list(impls) if rep % 2 == 0 else list(reversed(impls))  # alternate who goes first
        for name in names:
            results[name].append(impls[name](dataset, warmup=5))
    return results


def cpu_rows(quick: bool = False) -> list[dict]:
    steps, reps = (40, 3) if quick else (150, 7)
    res = run_on_ranks(_cpu_runs, (steps, reps), CPU_WORLD, "the CPU training benchmark")
    note = (
        f"{CPU_WORLD} gloo processes x batch {CPU_BATCH}, MLP {CPU_FEATURES}-{CPU_HIDDEN}-{CPU_HIDDEN}-{CPU_CLASSES}, "
        f"AdamW, median step interval of {steps} steps per repetition, {reps} interleaved repetitions"
    )
    rows = []
    for ref_name, what in (("ddp", "hand-written DDP+DistributedSampler"), ("reference", "accelerate")):
        if ref_name not in res:
            continue
        for k, (metric, unit) in enumerate(
            (("samples/s", "samples/s"), ("samples per CPU-second", "samples/cpu-s"))
        ):
            ours = [r[k] for r in res["accel_nb"]]
            ref = [r[k] for r in res[ref_name]]
            # repetitions ran back to back, so each pair saw the same machine load: the median of the
            # per-repetition ratios is steadier than the ratio of medians on a shared machine
            paired = statistics.median(a / b for a, b in zip(ours, ref))
            goal = "; goal ratio >= 0.97" if ref_name == "ddp" else ""
            rows.append(
                _row(
                    "training_cpu_2proc",
                    f"{metric} vs {what} (median, paired ratio)",
                    statistics.median(ours),
                    statistics.median(ref),
                    unit,
                    note + f"; reference column = {what}; ratio = median of per-repetition ratios{goal}",
                    ratio=paired,
                )
            )
            rows.append(
                _row(
                    "training_cpu_2proc",
                    f"{metric} vs {what} (best)",
                    max(ours),
                    max(ref),
                    unit,
                    note + f"; reference column = {what}; best repetition of each",
                )
            )
    return rows


def _row(
    bench: str, metric: str, ours: float, ref: float | None, unit: str, note: str, ratio: float | None = None
) -> dict:
    if ratio is None and ref:
        ratio = ours / ref
    return {
        "benchmark": bench,
        "metric": metric,
        "accel_nb": ours,
        "reference": ref,
        "ratio": ratio,
        "unit": unit,
        "note": note,
    }


# -- GPU: GPT-2 small, bf16, one process ----------------------------------------------------------------
GPT_BATCH, GPT_SEQ = 8, 512


def _gpt2(small: bool) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if small:  # a tiny configuration to check the code path on a CPU
        config = GPT2Config(
            n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=0
        )
    else:  # GPT-2 small: 12 layers, 12 heads, 768 wide, 124M parameters
        config = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    config.use_cache = False
    return GPT2LMHeadModel(config)


def _token_loader(steps: int, vocab: int, seq: int, pin: bool) -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (steps * GPT_BATCH, seq), generator=g)
    return DataLoader(TensorDataset(ids), batch_size=GPT_BATCH, pin_memory=pin)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gpu_plain(device: torch.device, steps: int, warmup: int, small: bool) -> float:
    model = _gpt2(small).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = _token_loader(
        steps + warmup,
        model.config.vocab_size,
        min(GPT_SEQ, model.config.n_positions),
        pin=device.type == "cuda",
    )
    times = []
    it = iter(loader)
    for i in range(steps + warmup):
        _sync(device)
        start = time.perf_counter()
        (ids,) = next(it)
        ids = ids.to(device, non_blocking=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    del it, model, opt
    return statistics.median(times)


def _gpu_prepared(make_accelerator: Any, device: torch.device, steps: int, warmup: int, small: bool) -> float:
    accelerator = make_accelerator()
    model = _gpt2(small)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = _token_loader(
        steps + warmup,
        model.config.vocab_size,
        min(GPT_SEQ, model.config.n_positions),
        pin=device.type == "cuda",
    )
    model, opt, loader = accelerator.prepare(model, opt, loader)
    times = []
    it = iter(loader)
    for i in range(steps + warmup):
        _sync(device)
        start = time.perf_counter()
        (ids,) = next(it)  # the prepared loader moves the batch: its cost is inside the step, as above
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    del it
    accelerator.free_memory()
    del model, opt
    return statistics.median(times)


def gpu_rows(quick: bool = False, device: str | None = None) -> list[dict]:
    """Per-step time of GPT-2 small in bf16; ``device="cpu"`` runs a tiny model to check the code."""
    if device is None:
        if not torch.cuda.is_available():
            return []
        device = "cuda"
    dev = torch.device(device)
    small = dev.type != "cuda"
    steps, warmup, reps = (3, 1, 1) if small else ((20, 5, 3) if quick else (50, 10, 5))
    from accel_nb import Accelerator
    from accel_nb.state import _reset_all_states

    _reset_all_states()
    ours_acc = None

    def make_ours() -> Any:
        nonlocal ours_acc
        if ours_acc is None:
            ours_acc = Accelerator(mixed_precision="bf16", cpu=dev.type == "cpu")
        return ours_acc

    impls: dict[str, Any] = {
        "plain": lambda: _gpu_plain(dev, steps, warmup, small),
        "accel_nb": lambda: _gpu_prepared(make_ours, dev, steps, warmup, small),
    }
    if _has_reference():
        from accelerate import Accelerator as ReferenceAccelerator

        ref_acc: list[Any] = []

        def make_ref() -> Any:
            if not ref_acc:
                ref_acc.append(ReferenceAccelerator(mixed_precision="bf16", cpu=dev.type == "cpu"))
            return ref_acc[0]

        impls["reference"] = lambda: _gpu_prepared(make_ref, dev, steps, warmup, small)
    results: dict[str, list[float]] = {k: [] for k in impls}
    for rep in range(reps):
        for name in list(impls) if rep % 2 == 0 else list(reversed(impls)):
            results[name].append(impls[name]())
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (tiny config, code check only)"
    what = "tiny GPT-2 config (code check)" if small else "GPT-2 small (124M, from GPT2Config)"
    note = (
        f"{what} bf16, batch {GPT_BATCH} x {GPT_SEQ} tokens, AdamW, one process "
        f"on {name}; median step of {steps} after {warmup} warm-up, {reps} interleaved repetitions"
    )
    rows = []
    for label, pick in (("median", statistics.median), ("min", min)):
        ours, plain = pick(results["accel_nb"]), pick(results["plain"])
        rows.append(
            _row(
                "training_gpt2_bf16",
                f"step time vs plain PyTorch ({label})",
                ours,
                plain,
                "s/step",
                note + "; reference column = plain PyTorch + torch.autocast; goal ratio <= 1.01",
            )
        )
        if "reference" in results:
            rows.append(
                _row(
                    "training_gpt2_bf16",
                    f"step time vs accelerate ({label})",
                    ours,
                    pick(results["reference"]),
                    "s/step",
                    note + "; reference column = accelerate",
                )
            )
    _reset_all_states()
    return rows


def run(quick: bool = False) -> list[dict]:
    return cpu_rows(quick) + gpu_rows(quick)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    rows = gpu_rows(quick, device="cpu") if "--check-gpu-code-on-cpu" in argv else run(quick)
    for row in rows:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        ref = f"{row['reference']:.4g}" if row["reference"] is not None else "-"
        print(
            f"{row['benchmark']:22s} {row['metric']:58s} accel_nb={row['accel_nb']:.4g} reference={ref} "
            f"ratio={ratio} {row['unit']}  ({row['note']})"
        )


if __name__ == "__main__":
    main()
