"""A data-parallel text classifier with gradient accumulation, logging and metrics (accelerate style)."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from common import checksum, report, synthetic_tokens  # noqa: E402

logger = get_logger(__name__)


class BagClassifier(torch.nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(vocab, dim)
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def main():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    set_seed(42)
    data = synthetic_tokens()
    train = DataLoader(data[:64], batch_size=8, shuffle=True)
    evaluate = DataLoader(data[64:], batch_size=6)
    model = BagClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer, train, evaluate = accelerator.prepare(model, optimizer, train, evaluate)
    losses = []
    for epoch in range(3):
        model.train()
        for tokens, labels in train:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(tokens), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        mean_loss = accelerator.reduce(loss.detach(), "mean").item()
        losses.append(mean_loss)
        logger.info(f"epoch {epoch}: loss {mean_loss:.4f}")
    model.eval()
    correct = total = 0
    for tokens, labels in evaluate:
        with torch.no_grad():
            predictions = model(tokens).argmax(dim=-1)
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct += (predictions == labels).sum().item()
        total += labels.numel()
    report(accelerator, losses=losses, accuracy=correct / total, evaluated=total, checksum=checksum(model))
    accelerator.end_training()


if __name__ == "__main__":
    main()
