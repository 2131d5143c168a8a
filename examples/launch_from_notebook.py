"""notebook_launcher end to end, runnable as a script or cell by cell in Jupyter.

python examples/launch_from_notebook.py

1. train a tiny regression on 2 CPU processes and get each rank's result back;
2. see a failing rank reported (its traceback, the other rank stopped, LaunchError.failures).
"""

import torch

from accel_nb import Accelerator, LaunchError, PartialState, notebook_launcher, set_seed


def train(epochs: int = 20) -> dict:
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    x = torch.linspace(-1, 1, 128).unsqueeze(1)
    data = torch.utils.data.TensorDataset(x, 3 * x + 1)
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if epoch % 5 == 0:
            print(f"epoch {epoch} loss={loss.item():.4f}")
    final = accelerator.reduce(loss.detach(), reduction="mean").item()
    return {"rank": accelerator.process_index, "loss": final, "model": accelerator.unwrap_model(model)}


def fails_on_rank_1() -> None:
    if PartialState().process_index == 1:
        raise ValueError("this rank found a NaN")
    import time

    time.sleep(30)  # rank 0 is stopped long before this ends


if __name__ == "__main__":
    results = notebook_launcher(train, num_processes=2, cpu=True)
    for r in results:
        print(f"rank {r['rank']}: loss {r['loss']:.4f}, weight {r['model'].weight.item():.3f}")

    try:
        notebook_launcher(fails_on_rank_1, num_processes=2, cpu=True)
    except LaunchError as err:
        print("caught:", err.failures[0].summary())
