"""Programs the tests in tests/xla run on XLA's CPU backend, each in its own process.

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python -m tests.xla.xla_programs ops OUT_DIR

``torch_xla.launch`` runs the program once per XLA device (threads of this process on the CPU
backend); each device writes ``OUT_DIR/<program>_rank<N>.json``. Weights are initialised
explicitly (the device threads share torch's global RNG, so seeding per rank would not help).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

DIM_IN, DIM_OUT, SAMPLES = 4, 3, 32


def _write(out_dir: str, name: str, rank: int, result: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, f"{name}_rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _cpu_list(t: torch.Tensor) -> Any:
    return t.detach().cpu().tolist()


# -- (a) the collectives -------------------------------------------------------------------------------
def ops_program(out_dir: str) -> None:
    from accel_nb import Accelerator

    acc = Accelerator()
    r, dev = acc.process_index, acc.device
    mine = torch.tensor([float(r + 1), 10.0 * (r + 1)], device=dev)
    rows = torch.full((r + 1, 2), float(r + 1), device=dev)  # rank r holds r+1 rows
    result = {
        "distributed_type": acc.distributed_type.value,
        "num_processes": acc.num_processes,
        "device": str(dev),
        "is_main_process": acc.is_main_process,
        "gather": _cpu_list(acc.gather(mine)),
        "gather_scalar": _cpu_list(acc.gather(torch.tensor(float(r), device=dev))),
        "gather_nested": {k: _cpu_list(v) for k, v in acc.gather({"a": mine, "b": mine.long()}).items()},
        "sum": _cpu_list(acc.reduce(mine, "sum")),
        "mean": _cpu_list(acc.reduce(mine, "mean")),
        "max": _cpu_list(acc.reduce(mine, "max")),
        "broadcast": _cpu_list(__import__("accel_nb.ops", fromlist=["broadcast"]).broadcast(mine.clone(), 1)),
        "pad": _cpu_list(acc.pad_across_processes(rows)),
        "pad_first": _cpu_list(acc.pad_across_processes(rows, pad_index=-1, pad_first=True)),
        "gather_object": __import__("accel_nb.ops", fromlist=["gather_object"]).gather_object([f"rank{r}"]),
        "cpu_tensor_gather": _cpu_list(acc.gather(torch.tensor([r]))),
    }
    acc.wait_for_everyone()
    _write(out_dir, "ops", r, result)


# -- (b) and (c) training ------------------------------------------------------------------------------
def _data() -> torch.utils.data.TensorDataset:
    x = torch.linspace(-1.0, 1.0, SAMPLES * DIM_IN).reshape(SAMPLES, DIM_IN)
    x = x * torch.arange(1, DIM_IN + 1, dtype=torch.float32)
    w_true = torch.linspace(0.5, -0.5, DIM_IN * DIM_OUT).reshape(DIM_IN, DIM_OUT)
    return torch.utils.data.TensorDataset(x, torch.sin(x @ w_true))


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(DIM_IN, 8), torch.nn.Tanh(), torch.nn.Linear(8, DIM_OUT))
    with torch.no_grad():  # explicit weights: the device threads share the global RNG
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.linspace(-0.3, 0.3 + 0.1 * i, p.numel()).reshape(p.shape))
    return model


def _setup(
    batch_size: int, decay_every: int = 10**6, rng_types: Any = None, accumulation: int = 1
) -> tuple[Any, Any, Any, Any, Any]:
    """Accelerator, model, SGD with momentum, loader and an LR schedule, all prepared.

    The prepared schedule advances once per process and step (it counts samples), so the equivalence
    run keeps its LR constant (``decay_every`` large).
    """
    from accel_nb import Accelerator

    acc = Accelerator(rng_types=rng_types, gradient_accumulation_steps=accumulation)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=decay_every, gamma=0.5)
    loader = torch.utils.data.DataLoader(_data(), batch_size=batch_size, shuffle=False)
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    return acc, model, optimizer, loader, scheduler


def _step(
    acc: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    norms: list[torch.Tensor] | None = None,
) -> float:
    with acc.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        if acc.sync_gradients:  # the norm is that of the averaged gradients; it clips some steps, not
            # all (clipping every step would hide a gradient summed instead of averaged)
            norm = acc.clip_grad_norm_(model.parameters(), max_norm=1.0)
            if norms is not None:  # read after training: see docs/tpu.md, devices as threads
                norms.append(norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return float(acc.reduce(loss.detach(), "mean").item())


def _weights(acc: Any, model: Any) -> dict[str, Any]:
    return {k: _cpu_list(v) for k, v in acc.unwrap_model(model).state_dict().items()}


def train_program(out_dir: str) -> None:
    """Two epochs over the dataset; 8 samples per optimizer step whatever the number of devices
    (``XLA_TEST_ACCUMULATION=2``: in two accumulated micro-batches)."""
    world = int(os.environ.get("CPU_NUM_DEVICES", "1"))
    accumulation = int(os.environ.get("XLA_TEST_ACCUMULATION", "1"))
    acc, model, optimizer, loader, scheduler = _setup(
        8 // world // accumulation, rng_types=["xla"], accumulation=accumulation
    )
    losses, batch_devices, norms = [], set(), []
    for _epoch in range(2):
        for x, y in loader:
            batch_devices.add(str(x.device))
            losses.append(_step(acc, model, optimizer, scheduler, x, y, norms))
    # evaluation over 30 samples: the last round is padded to fill every device, gather_for_metrics drops it
    x, y = _data().tensors
    evaluation = acc.prepare(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:30], y[:30]), batch_size=4)
    )
    gathered = []
    with torch.no_grad():
        for xb, yb in evaluation:
            gathered.append(
                acc.gather_for_metrics(torch.nn.functional.mse_loss(model(xb), yb, reduction="none"))
            )
    result = {
        "eval_rows": sum(int(g.shape[0]) for g in gathered),
        "eval_loss": float(torch.cat(gathered).mean().item()),
        "losses": losses,
        "norms": [float(n.cpu()) for n in norms],
        "weights": _weights(acc, model),
        "batch_devices": sorted(batch_devices),
        "model_class": type(model).__name__,
        "steps_per_epoch": len(loader),
    }
    _write(out_dir, f"train{accumulation if accumulation > 1 else ''}", acc.process_index, result)


def checkpoint_program(out_dir: str) -> None:
    """``phase=save``: 2 steps, save_state, 2 more steps (losses); ``phase=load``: load_state, the same 2 steps."""
    phase = os.environ["XLA_TEST_PHASE"]
    ckpt = os.path.join(out_dir, "ckpt")
    acc, model, optimizer, loader, scheduler = _setup(batch_size=4, decay_every=2)
    if phase == "load":
        acc.load_state(ckpt)
    losses, saved = [], None
    for step, (x, y) in enumerate(loader):
        losses.append(_step(acc, model, optimizer, scheduler, x, y))
        if phase == "save" and step == 1:
            acc.save_state(ckpt)
            acc.save_model(model, os.path.join(out_dir, "model"))
            saved = _weights(acc, model)
            losses = []  # what comes after the checkpoint
        if len(losses) == 2:
            break
    result = {
        "losses": losses,
        "weights": _weights(acc, model),
        "lr": scheduler.get_last_lr(),
        "saved": saved,
    }
    _write(out_dir, f"checkpoint_{phase}", acc.process_index, result)


def precision_program(out_dir: str) -> None:
    """bf16 autocasts the forward on the XLA device (outputs back in fp32); fp16, FSDP and torch.compile are refused."""
    from accel_nb import Accelerator
    from accel_nb.state import AcceleratorState

    seen: dict[str, str] = {}
    try:
        Accelerator(mixed_precision="fp16")
        fp16_error = None
    except ValueError as exc:
        fp16_error = str(exc)
    refused = {}
    for name, kwargs in {"fsdp": {"fsdp": True}, "compile": {"compile": True}}.items():
        AcceleratorState._reset_state()
        try:
            Accelerator(**kwargs)
            refused[name] = None
        except ValueError as exc:
            refused[name] = str(exc)
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision="bf16")
    model = _model()
    # returns None: output kept
    model[0].register_forward_hook(lambda m, i, o: seen.update(inner=str(o.dtype)))
    model = acc.prepare(model)
    out = model(torch.ones(2, DIM_IN, device=acc.device))
    _write(
        out_dir,
        "precision",
        acc.process_index,
        {"fp16_error": fp16_error, "inner": seen["inner"], "output": str(out.dtype), **refused},
    )


def skipped_collective_program(out_dir: str) -> None:
    """Process 1 leaves out a gather that process 0 makes: process 0 must fail with a clear error, not hang."""
    from accel_nb import Accelerator

    acc = Accelerator()
    if acc.process_index == 0:
        acc.gather(torch.ones(1, device=acc.device))
    _write(out_dir, "skipped_collective", acc.process_index, {"done": True})


PROGRAMS = {
    "skipped_collective": skipped_collective_program,
    "ops": ops_program,
    "train": train_program,
    "checkpoint": checkpoint_program,
    "precision": precision_program,
}


def _run(index: int, name: str, out_dir: str) -> None:
    PROGRAMS[name](out_dir)


if __name__ == "__main__":
    import torch_xla

    torch_xla.launch(_run, args=(sys.argv[1], sys.argv[2]))
