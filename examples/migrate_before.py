"""Migration pair: migrate_before.py is plain PyTorch, migrate_after.py the same loop on accel_nb.

They differ in 5 lines (see docs/migration.md). Run either one on its own:
    python examples/migrate_before.py
    python examples/migrate_after.py      # or: accel-nb launch --num_processes 2 examples/migrate_after.py
"""

# ruff: noqa: I001  (the accel_nb import sits with the others so the two files differ in 5 lines)
import torch
from torch.utils.data import DataLoader, TensorDataset


def main(epochs: int = 3) -> float:
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    for epoch in range(epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    return loss.item()


if __name__ == "__main__":
    main()
