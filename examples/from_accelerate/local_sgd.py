"""Local SGD: local steps on each process, weights averaged every 3 steps (accelerate style)."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD
from accelerate.utils import gather_object, set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import checksum, report, synthetic_images  # noqa: E402


def main():
    accelerator = Accelerator()
    set_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    loader = DataLoader(synthetic_images(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    checksums = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=3, enabled=True) as local_sgd:
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            checksums.append(checksum(model))
    per_rank = gather_object([checksum(model)])
    report(accelerator, checksums=checksums, per_rank=per_rank, checksum=checksum(model))
    accelerator.end_training()


if __name__ == "__main__":
    main()
