"""Peak host memory while loading quantized: under (largest shard + quantized model) x 1.3, never the float model.

The load runs in a fresh subprocess. Its peak RSS is read from the kernel's high-water mark
(VmHWM in /proc/self/status), reset just before the load by writing 5 to /proc/self/clear_refs:
the true peak, with no sampling and no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip(
    "bitsandbytes", reason="bitsandbytes is not installed (pip install 'accel_nb[quantization]')"
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOADER = r"""
import gc, json, sys, warnings
warnings.filterwarnings("ignore")
import torch
torch.set_num_threads(1)
import bitsandbytes, transformers
from accel_nb.big_model import init_empty_weights
from accel_nb.big_model.quantization import BnbQuantizationConfig, load_and_quantize_model

ckpt, kind = sys.argv[1], sys.argv[2]
config = transformers.LlamaConfig.from_pretrained(ckpt)
with init_empty_weights():
    model = transformers.LlamaForCausalLM(config)
quant = (BnbQuantizationConfig(load_in_8bit=True) if kind == "int8"
         else BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"))
# bitsandbytes' one-time setup (its CPU kernels, code books: ~40 MiB the first time any layer is
# quantized) is not the loader's memory: quantize one small layer first
load_and_quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)), quant, device_map={'': 'cpu'})

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
base = status("VmRSS")
assert status("VmHWM") <= base + (1 << 20), "the peak RSS could not be reset"
load_and_quantize_model(model, quant, weights_location=ckpt, device_map={'': 'cpu'})
peak = status("VmHWM")

def stored(p):
    n = p.numel() * p.element_size()
    for extra in ("SCB",):
        if getattr(p, extra, None) is not None:
            n += getattr(p, extra).numel() * getattr(p, extra).element_size()
    state = getattr(p, "quant_state", None)
    if state is not None:
        n += sum(t.numel() * t.element_size() for t in (state.absmax, state.code))
    return n

kept = sum(stored(p) for p in model.parameters()) + sum(b.numel() * b.element_size() for b in model.buffers())
print(json.dumps({"base": base, "peak": peak, "kept": kept}))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A Llama-style model, ~85 MB in float32, saved as ~40 MB safetensors shards (weights of 1.5 MB at most)."""
    cfg = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=12,
        num_attention_heads=6,
        num_key_value_heads=6,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    folder = tmp_path_factory.mktemp("llama_mem")
    model.save_pretrained(folder, max_shard_size="40MB")
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    shards = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors")]
    assert len(shards) >= 2
    return str(folder), max(os.path.getsize(s) for s in shards), float_bytes


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_peak_rss_while_loading_quantized(checkpoint, kind):
    folder, largest_shard, float_bytes = checkpoint
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    res = subprocess.run(
        [sys.executable, "-c", LOADER, folder, kind],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    grew = out["peak"] - out["base"]
    bound = (largest_shard + out["kept"]) * 1.3
    assert out["kept"] < float_bytes / 2.5  # it really is quantized
    assert bound < float_bytes  # the bound is one a float load could not meet
    assert grew < bound, (
        f"peak RSS grew by {grew / 2**20:.1f} MiB, over (largest shard {largest_shard / 2**20:.1f} MiB + quantized "
        f"model {out['kept'] / 2**20:.1f} MiB) x 1.3 = {bound / 2**20:.1f} MiB (float model: {float_bytes / 2**20:.1f} MiB)"
    )
