"""Checkpoint, stop, resume: a 2-process run interrupted half-way ends exactly like an uninterrupted one.

    python examples/resume_training.py                    # the whole demo (3 launches of 2 CPU ranks)
    python examples/resume_training.py --project runs/a --stop-after 7   # train, stop after step 7
    python examples/resume_training.py --project runs/a                  # resume from the newest checkpoint

Each launch starts 2 ranks of this file (gloo on CPU); under torchrun or ``accel-nb launch`` the
training function runs directly.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

TOTAL_STEPS = 12
SAVE_EVERY = 3


def train(project: str, stop_after: int | None, tag: str) -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator, ProjectConfiguration, set_seed

    set_seed(0)
    config = ProjectConfiguration(project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, :1] - x[:, 1:2]).tanh()
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=TOTAL_STEPS)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    step, losses = 0, []
    checkpoints = os.path.join(project, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        path = accelerator.load_state()  # the newest complete checkpoint; its step is in the folder name
        step = (int(os.path.basename(path).split("_")[1]) + 1) * SAVE_EVERY
        accelerator.print(f"resumed from {path} at step {step}")
    while step < TOTAL_STEPS:
        for xb, yb in loader:  # a resumed loader continues with the batch after the saved one
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(round(accelerator.reduce(loss.detach(), "mean").item(), 8))
            step += 1
            if step % SAVE_EVERY == 0:
                accelerator.save_state()  # checkpoints/checkpoint_<i>, written atomically
            if step == TOTAL_STEPS or step == stop_after:
                break
        if step == stop_after:
            accelerator.print(f"stopping after step {step} (as if the job were preempted)")
            break
    if accelerator.is_main_process:
        weights = sum(p.double().sum().item() for p in accelerator.unwrap_model(model).parameters())
        with open(os.path.join(project, f"result_{tag}.json"), "w") as f:
            json.dump({"losses": losses, "weights_sum": weights}, f)


def launch(project: str, stop_after: int | None, tag: str, num_processes: int = 2) -> None:
    """Start ``num_processes`` ranks of this file with the torchrun environment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, os.path.abspath(__file__), "--project", project, "--tag", tag]
    if stop_after is not None:
        args += ["--stop-after", str(stop_after)]
    procs = []
    for rank in range(num_processes):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(num_processes),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(num_processes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen(args, env=env))
    if any(p.wait() for p in procs):
        raise SystemExit("a rank failed")


def demo() -> None:
    root = tempfile.mkdtemp(prefix="accel_nb_resume_")
    launch(os.path.join(root, "straight"), None, "straight")
    interrupted = os.path.join(root, "interrupted")
    launch(interrupted, 7, "first")  # checkpoints after steps 3 and 6, then stops after step 7
    launch(interrupted, None, "second")  # resumes from checkpoint_1 (step 6) and redoes step 7
    straight = json.load(open(os.path.join(root, "straight", "result_straight.json")))
    first = json.load(open(os.path.join(interrupted, "result_first.json")))
    second = json.load(open(os.path.join(interrupted, "result_second.json")))
    resumed = first["losses"][:6] + second["losses"]
    print("uninterrupted losses:", straight["losses"])
    print("resumed losses:      ", resumed)
    same = resumed == straight["losses"] and second["weights_sum"] == straight["weights_sum"]
    print("identical:", same)
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project")
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--tag", default="run")
    opts = parser.parse_args()
    if "RANK" in os.environ:
        train(opts.project, opts.stop_after, opts.tag)
    elif opts.project:
        launch(opts.project, opts.stop_after, opts.tag)
    else:
        demo()
