"""The script ``accel-nb test`` launches: every rank checks the set-up a training run needs, then it says so.

Run under the launcher (``accel-nb launch -m accel_nb.launch.rank.selfcheck``): the processes meet, a
collective reaches every rank, a prepared model takes one training step with a prepared optimizer and data
loader, and every rank ends with the same weights. A failed check raises (the launch fails, naming the rank).
"""

from __future__ import annotations

import torch


def main() -> None:
    """Run the checks in this rank; the main process prints the result."""
    from accel_nb import Accelerator  # deferred: import time (the module is only run, never imported)
    from accel_nb.ops import gather

    accelerator = Accelerator()
    n, rank = accelerator.num_processes, accelerator.process_index
    ranks = gather(torch.tensor([rank], device=accelerator.device)).cpu().tolist()
    if ranks != list(range(n)):
        raise RuntimeError(f"gather across the {n} processes returned {ranks}, not {list(range(n))}")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.utils.data.TensorDataset(torch.randn(8 * n, 4), torch.randn(8 * n, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    before = accelerator.unwrap_model(model).weight.detach().clone()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    weight = accelerator.unwrap_model(model).weight.detach()
    if torch.equal(weight, before):
        raise RuntimeError("the optimizer step did not change the weights")
    everyone = gather(weight.reshape(1, -1))
    if not torch.allclose(everyone, everyone[0].expand_as(everyone)):
        raise RuntimeError(
            "the processes ended the step with different weights (gradients were not averaged)"
        )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"accel_nb self-check passed on {n} process(es), device {accelerator.device}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
