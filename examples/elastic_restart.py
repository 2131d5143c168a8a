"""A worker dies, the elastic agent restarts the ranks, training resumes from the last ``save_state``.

    accel-nb launch --num_processes 2 --cpu --max_restarts 1 examples/elastic_restart.py \\
        --project runs/restart --kill-rank 1 --kill-at-step 7

Rank 1 kills itself (SIGKILL) after step 7 of a run that started from scratch; the agent stops
the other rank and starts both again; they load the newest checkpoint (saved after step 6) and
finish. Rank 0 appends one JSON line per step to ``<project>/steps.jsonl`` (the step this run
started at, the step, the loss) and writes the final weights' sum to ``<project>/result.json``:
the same as a run without ``--kill-rank``. Across machines, every machine's ranks restart and
resume the same way (``TORCHELASTIC_RESTART_COUNT`` counts only the restarts of this machine's
own failures, so the script goes by the checkpoint, not by that count).
"""

from __future__ import annotations

import argparse
import json
import os
import signal

TOTAL_STEPS = 12
SAVE_EVERY = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", required=True)
    parser.add_argument("--kill-rank", type=int, default=None, help="this rank dies in a run from scratch")
    parser.add_argument("--kill-at-step", type=int, default=7)
    opts = parser.parse_args()

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator, ProjectConfiguration, set_seed

    os.makedirs(opts.project, exist_ok=True)
    set_seed(0)
    config = ProjectConfiguration(opts.project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, :1] - x[:, 1:2]).tanh()
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    checkpoints = os.path.join(opts.project, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        # the newest complete checkpoint; checkpoint_<i> holds step (i+1)*SAVE_EVERY
        path = accelerator.load_state()
        step = (int(os.path.basename(path).split("_")[1]) + 1) * SAVE_EVERY
        accelerator.print(
            f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')}: resumed from {path} at step {step}"
        )
    started_at = step
    log = os.path.join(opts.project, "steps.jsonl")
    while step < TOTAL_STEPS:
        for xb, yb in loader:  # a resumed loader continues with the batch after the saved one
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            mean = round(accelerator.reduce(loss.detach(), "mean").item(), 8)
            step += 1
            if accelerator.is_main_process:
                with open(log, "a") as f:
                    f.write(json.dumps({"started_at": started_at, "step": step, "loss": mean}) + "\n")
            if step % SAVE_EVERY == 0:
                accelerator.save_state()  # checkpoints/checkpoint_<i>, written atomically
            if started_at == 0 and step == opts.kill_at_step and accelerator.process_index == opts.kill_rank:
                print(f"rank {opts.kill_rank}: killing myself after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == TOTAL_STEPS:
                break
    if accelerator.is_main_process:
        weights = sum(p.double().sum().item() for p in accelerator.unwrap_model(model).parameters())
        with open(os.path.join(opts.project, "result.json"), "w") as f:
            json.dump({"weights_sum": weights, "started_at": started_at}, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
