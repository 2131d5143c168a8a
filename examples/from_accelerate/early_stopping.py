"""Stop every process together when one of them sees the loss reach a target (accelerate style)."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import checksum, report, synthetic_images  # noqa: E402


def main():
    accelerator = Accelerator()
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(synthetic_images(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    stopped = False
    for _epoch in range(10):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if loss.item() < 0.2:  # this process alone decides...
                accelerator.set_trigger()
            if accelerator.check_trigger():  # ...and every process stops at the same step
                stopped = True
                break
        if stopped:
            break
    report(accelerator, steps=steps, stopped=stopped, checksum=checksum(model))
    accelerator.end_training()


if __name__ == "__main__":
    main()
