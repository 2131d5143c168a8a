"""What the migration scripts share: synthetic data and one result line."""

import json

import torch


def synthetic_tokens(n=96, length=12, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    labels = (tokens[:, :3].sum(dim=1) % 2).long()  # a rule the model can learn
    return list(zip(tokens, labels, strict=True))


def synthetic_images(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 8, 8, generator=g)
    labels = (images[:, 0, :4].mean(dim=(1, 2)) > 0).long()
    return list(zip(images, labels, strict=True))


def checksum(model):
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def report(accelerator, **values):
    """One line the test reads: RESULT {...} (main process only)."""
    if accelerator.is_main_process:
        print("RESULT " + json.dumps(values, sort_keys=True), flush=True)
