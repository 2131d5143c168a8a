"""Find the largest batch size that fits, retrying after an out-of-memory error (accelerate style)."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import find_executable_batch_size, set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import checksum, report, synthetic_images  # noqa: E402

TRIED = []


def main():
    accelerator = Accelerator()

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        accelerator.free_memory()  # drop what the failed attempt prepared
        TRIED.append(batch_size)
        set_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(synthetic_images(), batch_size=batch_size)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        if batch_size > 20:  # "activations" too large for this host: a real allocation failure
            torch.empty(batch_size * 10**15, dtype=torch.uint8)
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        return model

    model = train()
    report(accelerator, tried=TRIED, checksum=checksum(model))
    accelerator.end_training()


if __name__ == "__main__":
    main()
