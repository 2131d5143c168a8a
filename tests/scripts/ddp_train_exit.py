"""A plain 2-process training script: DDP, gradient accumulation, clipping, ``reduce`` each step.

Rank 0 writes the mean losses to the file given as first argument at the end, then the script
simply returns (no explicit teardown: interpreter exit must leave every rank with status 0).

    accel-nb launch --num_processes 2 --cpu tests/scripts/ddp_train_exit.py losses.json
"""

import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_nb import Accelerator


def main() -> None:
    out = sys.argv[1]
    accelerator = Accelerator(gradient_accumulation_steps=2)
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _epoch in range(2):
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            mean = accelerator.reduce(loss.detach(), reduction="mean")
            losses.append(float(mean))
    if accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(losses, f)


if __name__ == "__main__":
    main()
