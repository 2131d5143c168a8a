"""Big-model loading and offload streaming, accel_nb side by side with accelerate.

python -m benchmarks.bench_big_model [--quick]

CPU (always): load time and peak RSS of a sharded safetensors checkpoint (~2 GiB; 256 MiB with
--quick) into an empty model with load_checkpoint_and_dispatch(device_map="auto"), every load in
its own subprocess (clean RSS), weights touched afterwards so memory-mapped pages count too.
GPU (when CUDA is available):
- a ~6 GiB fp16 checkpoint of 8192x8192 linear layers loaded with device_map="auto" onto one GPU,
  as a multiple of reading the same safetensors straight to the GPU (goal <= 1.15x);
- with a 4 GiB GPU budget (the rest offloaded to CPU), the forward's effective weight-streaming
  rate (offloaded bytes / forward time) as a fraction of the measured pinned host-to-device
  bandwidth (goal >= 70%).
CPU, with bitsandbytes: bytes read from the offload folder per forward when the layers are
offloaded to disk quantized (8-bit, NF4) as a fraction of the same layers offloaded in float32;
load_and_quantize_model (8-bit, NF4) of a Llama-style transformers model from a sharded float32
checkpoint onto the CPU: load time and peak RSS growth, each load in its own subprocess, side by
side with the reference's loader (which fails on a CPU-only machine: its error is the row's note).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One subprocess = one measurement. argv: lib, ckpt, layers, dim, dtype, mode, max_memory(json)
WORKER = r"""
import gc, json, sys, threading, time
import psutil, torch
from torch import nn
lib, ckpt, layers, dim, dtype, mode, max_memory = sys.argv[1:8]
layers, dim, dtype = int(layers), int(dim), getattr(torch, dtype)
max_memory = json.loads(max_memory) or None
if max_memory:
    max_memory = {int(k) if k.isdigit() else k: v for k, v in max_memory.items()}
if lib == "accel_nb":
    from accel_nb import init_empty_weights, load_checkpoint_and_dispatch
else:
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
proc = psutil.Process()
out = {}
if mode == "direct":  # the floor: safetensors straight to the GPU, no model at all
    from safetensors import safe_open
    import os
    files = sorted(os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    torch.cuda.init(); torch.empty(1, device="cuda")
    t0 = time.perf_counter()
    kept = []
    for f in files:
        with safe_open(f, framework="pt", device="cuda:0") as h:
            kept += [h.get_tensor(k) for k in h.keys()]
    torch.cuda.synchronize()
    out["load_s"] = time.perf_counter() - t0
    print(json.dumps(out)); sys.exit(0)
if mode != "cpu":
    torch.cuda.init(); torch.empty(1, device="cuda")
with init_empty_weights():
    model = nn.Sequential(*[nn.Linear(dim, dim, bias=False) for _ in range(layers)]).to(dtype)
gc.collect()
base = proc.memory_info().rss
peak = [base]; stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.002)
th = threading.Thread(target=sample, daemon=True); th.start()
t0 = time.perf_counter()
model = load_checkpoint_and_dispatch(model, ckpt, device_map="auto", max_memory=max_memory, dtype=dtype)
if mode != "cpu":
    torch.cuda.synchronize()
out["load_s"] = time.perf_counter() - t0
if mode == "cpu":  # touch every weight: memory-mapped pages must count as well
    total = 0.0
    for p in model.parameters():
        total += float(p.float().sum())
    out["ready_s"] = time.perf_counter() - t0
peak[0] = max(peak[0], proc.memory_info().rss)
stop.set(); th.join()
out["peak_rss_delta"] = peak[0] - base
out["device_map_values"] = sorted({str(v) for v in model.hf_device_map.values()})
if mode == "offload":
    offloaded = 0
    for name, dev in model.hf_device_map.items():
        if dev == "cpu":
            offloaded += dim * dim * torch.empty((), dtype=dtype).element_size() * (layers if name == "" else 1)
    x = torch.randn(1, dim, dtype=dtype, device="cuda:0")
    with torch.no_grad():
        for _ in range(2):
            model(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(3):  # back-to-back forwards (steady state, as in generation), one sync per batch
            t0 = time.perf_counter()
            for _ in range(4):
                model(x)
            torch.cuda.synchronize(); times.append((time.perf_counter() - t0) / 4)
    # pinned host -> device bandwidth, measured here on the same GPU
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True); dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    dev.copy_(host, non_blocking=True); torch.cuda.synchronize()
    bw = []
    for _ in range(5):
        t0 = time.perf_counter(); dev.copy_(host, non_blocking=True); torch.cuda.synchronize(); bw.append(n / (time.perf_counter() - t0))
    out.update(offloaded_bytes=offloaded, forward_s=min(times), h2d_bytes_per_s=max(bw))
print(json.dumps(out))
"""


def _write_checkpoint(folder: str, layers: int, dim: int, dtype: str, shard_layers: int) -> int:
    """Shards of ``shard_layers`` layers each, written one at a time; returns total bytes."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    tdtype = getattr(torch, dtype)
    weight_map, total = {}, 0
    shards = (layers + shard_layers - 1) // shard_layers
    g = torch.Generator().manual_seed(0)
    for s in range(shards):
        part = {}
        for i in range(s * shard_layers, min(layers, (s + 1) * shard_layers)):
            part[f"{i}.weight"] = (torch.rand(dim, dim, generator=g, dtype=torch.float32) * 0.02 - 0.01).to(
                tdtype
            )
            total += part[f"{i}.weight"].numel() * part[f"{i}.weight"].element_size()
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, name))
        weight_map.update({k: name for k in part})
        del part
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


def _measure(
    lib: str, ckpt: str, layers: int, dim: int, dtype: str, mode: str, max_memory: dict | None = None
) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=ROOT)
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            WORKER,
            lib,
            ckpt,
            str(layers),
            str(dim),
            dtype,
            mode,
            json.dumps(max_memory or {}),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"{lib} {mode} failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}"
        )
    return json.loads(res.stdout.strip().splitlines()[-1])


def _row(metric: str, ours: float, ref: float | None, unit: str, note: str, bench: str = "big_model") -> dict:
    return {
        "benchmark": bench,
        "metric": metric,
        "accel_nb": ours,
        "reference": ref,
        "ratio": (ours / ref) if ref else None,
        "unit": unit,
        "note": note,
    }


def _has_accelerate() -> bool:
    try:
        import accelerate  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def _cpu_rows(quick: bool, workdir: str) -> list[dict]:
    dim = 4096  # 64 MiB per fp32 layer
    layers = 4 if quick else 32  # 256 MiB / 2 GiB
    shard_layers = 2 if quick else 8  # 128 MiB / 512 MiB shards
    ckpt = os.path.join(workdir, "cpu_ckpt")
    total = _write_checkpoint(ckpt, layers, dim, "float32", shard_layers)
    reps = 2 if quick else 3
    libs = ["accel_nb"] + (["accelerate"] if _has_accelerate() else [])
    runs: dict[str, list[dict]] = {lib: [] for lib in libs}
    for _ in range(reps):  # interleaved, so both see the same page cache
        for lib in libs:
            runs[lib].append(_measure(lib, ckpt, layers, dim, "float32", "cpu"))
    ours, ref = runs["accel_nb"], runs.get("accelerate")
    note = f"{total / 2**30:.2f} GiB in {layers // shard_layers} shards, {reps} runs each, fresh subprocesses, warm page cache"
    rows = [
        _row(
            "CPU load time, sharded checkpoint (median)",
            statistics.median(r["load_s"] for r in ours),
            statistics.median(r["load_s"] for r in ref) if ref else None,
            "s",
            note,
        ),
        _row(
            "CPU load + first read of every weight (median)",
            statistics.median(r["ready_s"] for r in ours),
            statistics.median(r["ready_s"] for r in ref) if ref else None,
            "s",
            "safetensors CPU tensors are memory-mapped: pages are read on first use, so this is the fair total",
        ),
        _row(
            "CPU load peak RSS growth incl. touching weights (median)",
            statistics.median(r["peak_rss_delta"] for r in ours) / 2**20,
            statistics.median(r["peak_rss_delta"] for r in ref) / 2**20 if ref else None,
            "MiB",
            f"weights kept: {total / 2**20:.0f} MiB; largest shard {total / (layers // shard_layers) / 2**20:.0f} MiB",
        ),
    ]
    return rows


def _gpu_rows(quick: bool, workdir: str) -> list[dict]:
    dim = 8192  # 128 MiB per fp16 layer
    layers = 8 if quick else 48  # 1 GiB / 6 GiB
    ckpt = os.path.join(workdir, "gpu_ckpt")
    total = _write_checkpoint(ckpt, layers, dim, "float16", 8)
    libs = ["accel_nb"] + (["accelerate"] if _has_accelerate() else [])
    reps = 2 if quick else 3
    direct, loads = [], {lib: [] for lib in libs}
    _measure("accel_nb", ckpt, layers, dim, "float16", "direct")  # warm the page cache
    for _ in range(reps):
        direct.append(_measure("accel_nb", ckpt, layers, dim, "float16", "direct")["load_s"])
        for lib in libs:
            loads[lib].append(_measure(lib, ckpt, layers, dim, "float16", "gpu")["load_s"])
    floor = min(direct)
    ours = min(loads["accel_nb"]) / floor
    ref = min(loads["accelerate"]) / floor if "accelerate" in loads else None
    rows = [
        _row(
            "GPU load device_map='auto' / safetensors straight to GPU",
            ours,
            ref,
            "x",
            f"{total / 2**30:.1f} GiB fp16, {dim}x{dim} layers; floor {floor:.2f} s; goal <= 1.15x (reference ~3.1x)",
        )
    ]
    budget = {"0": "1GiB" if quick else "4GiB", "cpu": "200GiB"}
    fractions = {}
    for lib in libs:
        r = _measure(lib, ckpt, layers, dim, "float16", "offload", budget)
        rate = r["offloaded_bytes"] / r["forward_s"]
        fractions[lib] = (rate / r["h2d_bytes_per_s"], rate, r)
    ours_f, ours_rate, r = fractions["accel_nb"]
    ref_f = fractions["accelerate"][0] if "accelerate" in fractions else None
    rows.append(
        _row(
            "offloaded forward: weight streaming rate / pinned H2D bandwidth",
            ours_f,
            ref_f,
            "fraction",
            f"GPU budget {budget['0']}; {r['offloaded_bytes'] / 2**30:.2f} GiB offloaded; "
            f"{ours_rate / 1e9:.1f} GB/s vs H2D {r['h2d_bytes_per_s'] / 1e9:.1f} GB/s; goal >= 0.70 (reference ~0.12)",
        )
    )
    return rows


def _quantized_offload_rows(workdir: str) -> list[dict]:
    """Bytes read from disk per forward: quantized disk offload / float32 disk offload, CPU execution."""
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # noqa: BLE001
        return [
            _row(
                "bytes read per forward, quantized / float disk offload",
                None,
                None,
                "x",
                "skipped: no bitsandbytes",
            )
        ]
    import torch
    from safetensors.torch import save_file
    from torch import nn

    from accel_nb import dispatch_model, init_empty_weights
    from accel_nb.big_model.quantization import BnbQuantizationConfig, load_and_quantize_model

    dim, layers = 1024, 4
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(dim, dim, bias=False) for _ in range(layers)]).eval()
    ckpt = os.path.join(workdir, "quant_offload_ckpt")
    os.makedirs(ckpt)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(ckpt, "model.safetensors")
    )
    x = torch.randn(2, dim)
    dispatch_model(model, {"": "disk"}, offload_dir=os.path.join(workdir, "float_off"), buffered=True)
    engine = model._accel_nb_engine
    with torch.no_grad():
        model(x)
    float_bytes = engine.bytes_streamed
    rows = []
    configs = {
        "int8": BnbQuantizationConfig(load_in_8bit=True, skip_modules=[], torch_dtype=torch.float32),
        "nf4": BnbQuantizationConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32,
            skip_modules=[],
        ),
    }
    for name, config in configs.items():
        with init_empty_weights():
            empty = nn.Sequential(*[nn.Linear(dim, dim, bias=False) for _ in range(layers)])
        quantized = load_and_quantize_model(
            empty,
            config,
            weights_location=ckpt,
            device_map={"": "disk"},
            offload_folder=os.path.join(workdir, name),
        ).eval()
        offloader = quantized._accel_nb_quantized_offloader
        with torch.no_grad():
            quantized(x)
        rows.append(
            _row(
                f"bytes read per forward, {name} disk offload / float32 disk offload",
                offloader.bytes_moved / float_bytes,
                None,
                "x",
                f"{layers} linear layers {dim}x{dim}, execution on the CPU: {offloader.bytes_moved / 2**20:.2f} MiB "
                f"quantized vs {float_bytes / 2**20:.2f} MiB float32 read from the offload folder per forward",
            )
        )
    return rows


# One subprocess = one quantized load. argv: lib, ckpt, kind ("int8" | "nf4")
QUANT_WORKER = r"""
import gc, json, sys, time, warnings
warnings.filterwarnings("ignore")
import bitsandbytes, torch, transformers
lib, ckpt, kind = sys.argv[1:4]
if lib == "accel_nb":
    from accel_nb import init_empty_weights
    from accel_nb.utils import BnbQuantizationConfig, load_and_quantize_model
else:
    from accelerate import init_empty_weights
    from accelerate.utils import BnbQuantizationConfig, load_and_quantize_model
config = transformers.AutoConfig.from_pretrained(ckpt)
with init_empty_weights():
    model = transformers.LlamaForCausalLM(config)
if kind == "int8":
    qconfig = BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32)
else:
    qconfig = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
def error(exc):
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' '.join(lines[0].split()) if lines else ''}"[:160]
# bitsandbytes' one-time setup (kernels, code books) is not the loader's memory: one small layer first
try:
    load_and_quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 64)), qconfig, device_map={"": "cpu"})
except Exception:
    pass
def status(key):  # the kernel's counters: the true peak (VmHWM), no sampling
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
base = status("VmRSS")
out = {}
t0 = time.perf_counter()
try:
    model = load_and_quantize_model(model, qconfig, weights_location=ckpt, device_map={"": "cpu"})
except Exception as exc:
    out["error"] = error(exc)
else:
    out["load_s"] = time.perf_counter() - t0
    out["model_bytes"] = sum(t.numel() * t.element_size() for t in model.state_dict().values())
out["peak_rss_delta"] = status("VmHWM") - base
print(json.dumps(out))
"""


def _quantized_load_rows(quick: bool, workdir: str) -> list[dict]:
    """load_and_quantize_model onto the CPU: time and peak RSS growth, accel_nb beside the reference."""
    try:
        import bitsandbytes  # noqa: F401
        import transformers
    except Exception:  # noqa: BLE001
        return [
            _row("quantized load onto the CPU", None, None, "s", "skipped: no bitsandbytes or transformers")
        ]
    import torch

    width, layers = (512, 4) if quick else (1024, 8)
    config = transformers.LlamaConfig(
        vocab_size=8192,
        hidden_size=width,
        intermediate_size=width * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        num_key_value_heads=width // 64,
    )
    ckpt = os.path.join(workdir, "quant_load_ckpt")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(ckpt, max_shard_size="64MB")
    shards = [os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors")]
    largest, total = max(map(os.path.getsize, shards)), sum(map(os.path.getsize, shards))
    libs = ["accel_nb"] + (["accelerate"] if _has_accelerate() else [])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=ROOT)
    rows = []
    for kind in ("int8", "nf4"):
        runs: dict[str, list[dict]] = {lib: [] for lib in libs}
        for _ in range(2 if quick else 3):  # interleaved: both see the same page cache
            for lib in libs:
                res = subprocess.run(
                    [sys.executable, "-c", QUANT_WORKER, lib, ckpt, kind],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=900,
                )
                lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
                if res.returncode != 0 or not lines:
                    raise RuntimeError(f"quantized load worker ({lib}, {kind}) failed:\n{res.stderr[-3000:]}")
                runs[lib].append(json.loads(lines[-1]))
        ours = runs["accel_nb"]
        if any("error" in r for r in ours):
            raise RuntimeError(f"accel_nb's {kind} load failed: {ours[0].get('error')}")
        theirs = [r for r in runs.get("accelerate", []) if "error" not in r]
        failed = next((r["error"] for r in runs.get("accelerate", []) if "error" in r), None)
        refnote = (
            f"; the reference failed on the CPU: {failed}"
            if failed
            else ("" if theirs else "; reference not installed")
        )
        quantized = ours[0]["model_bytes"]
        shape = (
            f"Llama-style {layers} layers x {width}, float32 checkpoint of {total / 2**20:.0f} MiB in "
            f"{len(shards)} shards, device_map {{'': 'cpu'}}, {len(ours)} runs each (median)"
        )
        rows.append(
            _row(
                f"{kind} load_and_quantize_model onto the CPU: time",
                statistics.median(r["load_s"] for r in ours),
                statistics.median(r["load_s"] for r in theirs) if theirs else None,
                "s",
                shape + refnote,
            )
        )
        rows.append(
            _row(
                f"{kind} load_and_quantize_model onto the CPU: peak RSS growth",
                statistics.median(r["peak_rss_delta"] for r in ours) / 2**20,
                statistics.median(r["peak_rss_delta"] for r in theirs) / 2**20 if theirs else None,
                "MiB",
                "bitsandbytes' one-time setup excluded (one small layer quantized first); kernel peak (VmHWM); "
                f"quantized model {quantized / 2**20:.0f} MiB, largest shard {largest / 2**20:.0f} MiB: "
                f"bound (shard + model) x 1.3 = {(largest + quantized) * 1.3 / 2**20:.0f} MiB" + refnote,
            )
        )
    return rows


def run(quick: bool = False) -> list[dict]:
    workdir = tempfile.mkdtemp(prefix="accel_nb_bench_big_")
    try:
        rows = _cpu_rows(quick, workdir)
        rows += _quantized_offload_rows(workdir)
        rows += _quantized_load_rows(quick, workdir)
        import torch

        if torch.cuda.is_available():
            shutil.rmtree(os.path.join(workdir, "cpu_ckpt"), ignore_errors=True)
            rows += _gpu_rows(quick, workdir)
        else:
            rows.append(
                _row(
                    "GPU load ratio and offload streaming fraction",
                    None,
                    None,
                    "x",
                    "skipped: no CUDA GPU on this machine",
                )
            )
        return rows
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(json.dumps(row))
