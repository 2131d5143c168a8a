"""Train a small transformer-like model compiled with torch.compile through accel_nb, from any face.

Notebook face (the compile options in code; notebook_launcher reads no config file):

    from accel_nb import CompileOptions, notebook_launcher
    from examples.compile_blocks import train
    notebook_launcher(train, args=(CompileOptions(backend="inductor", regional=True),), num_processes=2, cpu=True)

Script face (the launch config's dynamo_config decides; see docs/compile.md):

    accel-nb launch --config_file compile.yaml examples/compile_blocks.py

    # compile.yaml
    distributed_type: MULTI_CPU
    num_processes: 2
    use_cpu: true
    dynamo_config:
      dynamo_backend: INDUCTOR
      dynamo_use_regional_compilation: true

``--backend aot_eager --regional`` on the command line overrides the config. Each rank prints its
losses; with regional compilation the 4 blocks share one compiled graph.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from accel_nb import Accelerator, CompileOptions


class Block(nn.Module):
    """Pre-norm attention + MLP: the block repeated in the model (the one regional compilation compiles)."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyLM(nn.Module):
    """Embedding, 4 Blocks in a ModuleList, a head over a 64-token vocabulary."""

    def __init__(self, layers: int = 4, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train(compile: Any = None, steps: int = 6) -> dict[str, Any]:
    """Learn to repeat a fixed token sequence; returns this rank's losses and how the model was compiled.

    ``compile`` is ``Accelerator(compile=...)``: None leaves it to the launch config.
    """
    accelerator = Accelerator(compile=compile)
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    g = torch.Generator().manual_seed(1 + accelerator.process_index)  # each rank its own batches
    ids = torch.randint(0, 64, (8, 16), generator=g)
    losses = []
    for _ in range(steps):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    options = accelerator.compile_options
    plain = accelerator.unwrap_model(model, keep_torch_compile=False)
    compiled_blocks = sum(b._compiled_call_impl is not None for b in plain.blocks)
    summary = {
        "losses": losses,
        "backend": options.backend_label if options else None,
        "regional": bool(options and options.regional),
        "compiled_blocks": compiled_blocks,
    }
    accelerator.print(f"losses {', '.join(f'{v:.3f}' for v in losses)}; compile: {summary}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend", default=None, help="torch.compile backend (default: the launch config's)"
    )
    parser.add_argument("--regional", action="store_true", help="compile only the repeated blocks")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    options = CompileOptions(backend=args.backend, regional=args.regional) if args.backend else None
    train(options, args.steps)


if __name__ == "__main__":
    main()
