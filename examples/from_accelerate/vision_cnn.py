"""A small CNN with a DDP kwargs handler, a scheduler, clipping and a save/resume (accelerate style).

The checkpoint goes to the folder given as the first argument (default checkpoints/vision_cnn).
"""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import checksum, report, synthetic_images  # noqa: E402


def build(accelerator):
    set_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 8 * 8, 2),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    loader = DataLoader(synthetic_images(), batch_size=8)
    return accelerator.prepare(model, optimizer, loader, scheduler)


def train_epoch(accelerator, model, optimizer, loader, scheduler):
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return accelerator.reduce(loss.detach(), "mean").item()


def main():
    handler = DistributedDataParallelKwargs(broadcast_buffers=False)
    accelerator = Accelerator(kwargs_handlers=[handler])
    model, optimizer, loader, scheduler = build(accelerator)
    losses = [train_epoch(accelerator, model, optimizer, loader, scheduler)]
    folder = sys.argv[1] if len(sys.argv) > 1 else "checkpoints/vision_cnn"
    accelerator.save_state(folder)
    straight = [train_epoch(accelerator, model, optimizer, loader, scheduler)]
    straight_checksum = checksum(model)

    accelerator.load_state(folder)  # back to the end of epoch 1: the second epoch must replay exactly
    resumed = [train_epoch(accelerator, model, optimizer, loader, scheduler)]
    report(
        accelerator,
        losses=losses + straight,
        resumed=resumed,
        checksum=straight_checksum,
        resumed_checksum=checksum(model),
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
