"""Train a small GPT-like model with FSDP (torch's fully_shard) through accel_nb, from any face.

Script face (the launch config says FSDP; see docs/fsdp.md):

    accel-nb launch --config_file fsdp.yaml examples/fsdp_finetune.py --out runs/fsdp

    # fsdp.yaml
    distributed_type: FSDP
    num_processes: 2
    use_cpu: true
    fsdp_config:
      fsdp_version: 2
      fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
      fsdp_transformer_layer_cls_to_wrap: Block
      fsdp_state_dict_type: SHARDED_STATE_DICT

Notebook face (the options in code):

    from accel_nb import FSDPOptions, notebook_launcher
    from examples.fsdp_finetune import train
    notebook_launcher(train, args=(FSDPOptions(auto_wrap_classes=["Block"]),), num_processes=2, cpu=True)

Each rank holds about 1/N of the weights and optimizer state; the script prints the loss, each
rank's share of the parameter bytes, and writes full weights (``model.safetensors``, loadable into
a plain ``TinyGPT``) plus a sharded ``save_state`` checkpoint under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, LENGTH = 64, 32, 16


class Block(nn.Module):
    """One transformer block: causal self-attention and an MLP, each with a residual."""

    def __init__(self, width: int = WIDTH, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, a stack of ``Block``, a language-model head."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(LENGTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def counting_data(n: int = 256) -> TensorDataset:
    """Sequences that count up (mod VOCAB) from a random start: the next token is always the last + 1."""
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, VOCAB, (n, 1), generator=g)
    ids = (starts + torch.arange(LENGTH + 1)) % VOCAB
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def train(fsdp: Any = None, out: str | None = None, epochs: int = 2, batch_size: int = 16) -> dict[str, Any]:
    """Train on every process; ``fsdp`` None reads the launch config (accel-nb launch). Returns a summary."""
    from accel_nb import Accelerator
    from accel_nb.fsdp.sharding import local_shard_bytes
    from accel_nb.utils import set_seed

    accelerator = Accelerator(fsdp=fsdp)
    set_seed(0)
    model = TinyGPT()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(
        counting_data(), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(epochs):
        for ids, targets in loader:
            with accelerator.accumulate(model):
                logits = model(ids)
                loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    summary = {
        "distributed_type": str(accelerator.distributed_type.value),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "param_share": local_shard_bytes(model.parameters()) / full_bytes,
    }
    accelerator.print(json.dumps(summary))
    if out:
        accelerator.save_model(model, os.path.join(out, "weights"))  # full safetensors, on the main process
        accelerator.save_state(os.path.join(out, "checkpoint"))  # sharded: every rank writes its shards
        if accelerator.is_main_process:
            with open(os.path.join(out, "summary.json"), "w") as f:
                json.dump(summary, f)
    accelerator.wait_for_everyone()
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the weights, the checkpoint and summary.json")
    parser.add_argument("--epochs", type=int, default=2)
    ns = parser.parse_args()
    train(out=ns.out, epochs=ns.epochs)
