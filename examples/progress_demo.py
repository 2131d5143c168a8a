"""Live per-rank progress: 2 ranks train a small model, each with a progress bar and its loss.

In a notebook cell (JupyterLab / Notebook 7 / VS Code) the launch shows one widget: a bar per
rank, the loss, the rate, the time left, each rank's output; with ``--fail`` rank 1 raises halfway
and turns red with its traceback. In a terminal the same events print as ``[rank N]`` lines:

    python examples/progress_demo.py            # 2 CPU ranks, text lines
    python examples/progress_demo.py --fail     # rank 1 fails at step 40

In a notebook:  from examples.progress_demo import train; notebook_launcher(train, num_processes=2, cpu=True)
"""

from __future__ import annotations

import os
import sys


def train(epochs: int = 2, fail_rank: int | None = None) -> float:
    """A small data-parallel training loop reporting progress and metrics from every rank."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from accel_nb import Accelerator, progress

    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        bar = progress(loader, desc=f"epoch {epoch}")
        for step, (xb, yb) in enumerate(bar):
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            bar.set_postfix(loss=loss)  # a tensor is fine: it becomes a number when sent
            if fail_rank == accelerator.process_index and epoch == epochs - 1 and step == 40:
                raise ValueError(f"rank {fail_rank} gave up at step {step} (demo failure)")
        accelerator.log_metrics({"epoch_loss": loss.item()}, step=epoch)
        print(f"epoch {epoch} done, last loss {loss.item():.4f}")
    return round(loss.item(), 4)


def main(argv: list[str]) -> int:
    from accel_nb import LaunchError, notebook_launcher

    fail_rank = 1 if "--fail" in argv else None
    try:
        results = notebook_launcher(train, kwargs={"fail_rank": fail_rank}, num_processes=2, cpu=True)
    except LaunchError as exc:
        print(f"the launch failed as asked: {exc.failures[0].summary()}")
        return 0 if fail_rank is not None else 1
    print(f"final loss per rank: {results}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
