"""Peak RSS while loading a sharded checkpoint: at most 1.2 x the largest shard + the weights kept.

The load runs in a fresh subprocess; a thread samples its RSS every millisecond.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOADER = r"""
import gc, json, sys, threading, time
import psutil, torch
torch.set_num_threads(1)
from torch import nn
from accel_nb.big_model import init_empty_weights, load_checkpoint_in_model

ckpt, n_layers, dim, device_map = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
with init_empty_weights():
    model = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(n_layers)])
proc = psutil.Process()
gc.collect()
base = proc.memory_info().rss
peak = [base]
stop = threading.Event()

def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.001)

t = threading.Thread(target=sample, daemon=True)
t.start()
load_checkpoint_in_model(model, ckpt, device_map=device_map)
# touch every kept weight (CPU tensors may be copy-on-write mappings of the shards) and check it
ok = all(bool((p == float(i)).all()) for i, layer in enumerate(model)
         for p in layer.parameters() if p.device.type == "cpu")
peak[0] = max(peak[0], proc.memory_info().rss)
stop.set(); t.join()
kept = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type == "cpu")
assert ok, "wrong values after loading"
print(json.dumps({"base": base, "peak": peak[0], "kept": kept}))
"""

DIM = 2048  # one Linear = 16 MiB of fp32 weights
LAYERS = 12  # 3 layers per shard -> 4 shards of ~48 MiB


def _write_checkpoint(folder: str) -> int:
    """4 shards of 3 layers each, written one shard at a time (the test process stays small)."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    largest = 0
    shards = LAYERS // 3
    for s in range(shards):
        part = {}
        for i in range(3 * s, 3 * s + 3):
            part[f"{i}.weight"] = torch.full((DIM, DIM), float(i))
            part[f"{i}.bias"] = torch.full((DIM,), float(i))
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, name))
        largest = max(largest, os.path.getsize(os.path.join(folder, name)))
        weight_map.update({k: name for k in part})
        del part
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return largest


def _load_in_subprocess(folder: str, device_map: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", LOADER, folder, str(LAYERS), str(DIM), json.dumps(device_map)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("shards") / "ckpt")
    return folder, _write_checkpoint(folder)


def test_peak_rss_all_on_cpu(sharded):
    folder, largest = sharded
    got = _load_in_subprocess(folder, {"": "cpu"})
    grew = got["peak"] - got["base"]
    assert got["kept"] == LAYERS * (DIM * DIM + DIM) * 4
    limit = 1.2 * largest + got["kept"]
    assert grew <= limit, (
        f"RSS grew {grew / 2**20:.0f} MiB > {limit / 2**20:.0f} MiB (largest shard {largest / 2**20:.0f} MiB)"
    )


def test_peak_rss_half_on_disk_reads_only_what_stays(sharded):
    folder, largest = sharded
    device_map = {str(i): ("cpu" if i < LAYERS // 2 else "disk") for i in range(LAYERS)}
    got = _load_in_subprocess(folder, device_map)
    grew = got["peak"] - got["base"]
    assert got["kept"] == LAYERS // 2 * (DIM * DIM + DIM) * 4
    limit = 1.2 * largest + got["kept"]
    assert grew <= limit, f"RSS grew {grew / 2**20:.0f} MiB > {limit / 2**20:.0f} MiB"
