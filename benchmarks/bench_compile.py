"""torch.compile cold and warm start, whole model vs regional (repeated blocks), accel_nb vs accelerate.

The model: an embedding, N pre-norm transformer blocks written in torch (attention through
``scaled_dot_product_attention`` + MLP, width 64, 4 heads) in an ``nn.ModuleList``, a head;
batch 4 x 32 tokens, AdamW, one CPU process. Each measurement runs in a fresh interpreter:
``Accelerator(compile=CompileOptions(backend="inductor", regional=...))`` for accel_nb,
``Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor", use_regional_compilation=...))``
for the reference, then the time of the first training step (forward, backward, optimizer
step: dynamo tracing and inductor's C++ compilation happen here) and the median of 3 later steps.

"Cold": an empty inductor cache directory (``TORCHINDUCTOR_CACHE_DIR``). "Warm": a second fresh
interpreter with the cache the cold run left (the notebook case: relaunch after a kernel
restart); dynamo still traces, inductor reuses its compiled graphs. Inductor compiles with one
worker (``TORCHINDUCTOR_COMPILE_THREADS=1``) so the figures do not depend on the other load of
the machine's cores as much.

    python -m benchmarks.bench_compile [--quick]       # --quick: 4 blocks instead of 8
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, statistics, sys, time, warnings
import torch
from torch import nn
lib, regional, layers = sys.argv[1], sys.argv[2] == "regional", int(sys.argv[3])
warnings.simplefilter("ignore")

class Block(nn.Module):
    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))

class TinyLM(nn.Module):
    def __init__(self, layers, vocab=256, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

if lib == "accel_nb":
    from accel_nb import Accelerator, CompileOptions
    acc = Accelerator(cpu=True, compile=CompileOptions(backend="inductor", regional=regional))
else:
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin
    plugin = TorchDynamoPlugin(backend="inductor", use_regional_compilation=regional)
    acc = Accelerator(cpu=True, dynamo_plugin=plugin)
torch.manual_seed(0)
model = TinyLM(layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = acc.prepare(model, opt)
ids = torch.randint(0, 256, (4, 32))

def step():
    t = time.perf_counter()
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - t

first = step()
later = statistics.median(step() for _ in range(3))
print(json.dumps({"first_step_s": first, "later_step_s": later}))
"""


def measure(lib: str, variant: str, layers: int, cache_dir: str) -> dict:
    """One fresh interpreter's figures (``variant``: "whole" or "regional")."""
    env = {k: v for k, v in os.environ.items() if "DYNAMO" not in k}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=ROOT,
        TORCHINDUCTOR_CACHE_DIR=cache_dir,
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    done = subprocess.run(
        [sys.executable, "-c", WORKER, lib, variant, str(layers)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{lib} {variant}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cold_and_warm(lib: str, variant: str, layers: int) -> dict:
    """The first-step time with an empty inductor cache, then again in a new interpreter with that cache."""
    with tempfile.TemporaryDirectory(prefix="bench_compile_") as cache_dir:
        cold = measure(lib, variant, layers, cache_dir)
        warm = measure(lib, variant, layers, cache_dir)
    return {"cold": cold["first_step_s"], "warm": warm["first_step_s"], "step": warm["later_step_s"]}


def run(quick: bool = False) -> list[dict]:
    layers = 4 if quick else 8
    figures: dict[tuple[str, str], dict | None] = {}
    for variant in ("whole", "regional"):
        figures["accel_nb", variant] = cold_and_warm("accel_nb", variant, layers)
        try:
            figures["reference", variant] = cold_and_warm("accelerate", variant, layers)
        except (RuntimeError, subprocess.SubprocessError):
            figures["reference", variant] = None  # the reference is not installed (the `bench` extra)
    note = (
        f"{layers} transformer blocks (width 64), batch 4x32, inductor, 1 CPU process, fresh interpreter each"
    )
    rows = []
    for variant in ("whole", "regional"):
        for when, label in (("cold", "empty inductor cache"), ("warm", "second interpreter, same cache")):
            ours, ref = figures["accel_nb", variant], figures["reference", variant]
            rows.append(
                {
                    "benchmark": "compile",
                    "metric": f"first step, {variant} model, {when} ({label})",
                    "accel_nb": ours[when],
                    "reference": ref[when] if ref else None,
                    "unit": "s",
                    "note": note,
                }
            )
        ours, ref = figures["accel_nb", variant], figures["reference", variant]
        rows.append(
            {
                "benchmark": "compile",
                "metric": f"later step, {variant} model (median of 3)",
                "accel_nb": ours["step"],
                "reference": ref["step"] if ref else None,
                "unit": "s",
                "note": note,
            }
        )
    for when in ("cold", "warm"):
        ours = figures["accel_nb", "regional"][when] / figures["accel_nb", "whole"][when]
        ref_whole, ref_regional = figures["reference", "whole"], figures["reference", "regional"]
        ref = ref_regional[when] / ref_whole[when] if ref_whole and ref_regional else None
        rows.append(
            {
                "benchmark": "compile",
                "metric": f"first step, regional / whole, {when}",
                "accel_nb": ours,
                "reference": ref,
                "unit": "x",
                "note": "below 1: regional compilation starts faster",
            }
        )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        ref = "-" if row["reference"] is None else f"{row['reference']:.4g}"
        ratio = "-" if not row["reference"] else f"{row['accel_nb'] / row['reference']:.2f}x"
        print(
            f"{row['metric']:<62} accel_nb {row['accel_nb']:.4g} {row['unit']}  reference {ref}  ratio {ratio}"
        )
