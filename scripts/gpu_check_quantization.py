"""gpu_check step: bitsandbytes 8-bit and 4-bit (NF4) loading on one GPU, accel_nb's
``load_and_quantize_model`` side by side with the reference library's on the same checkpoint.

    python scripts/gpu_check_quantization.py OUT.json

A Llama-style model built from a config (no download) is saved as sharded safetensors; each library
loads it quantized onto the GPU in a fresh process. The figures: load time, GPU memory held after the
load, and the logits of a fixed batch compared with the float model's (max abs difference) and with
the other library's (they use the same bitsandbytes kernels, so they should agree closely).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("8bit", "nf4")


def _config():  # pragma: no cover - runs on a GPU machine
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=8192,
        max_position_embeddings=256,
    )


def _ids():  # pragma: no cover
    import torch

    return torch.randint(0, 8192, (2, 64), generator=torch.Generator().manual_seed(0))


def _save(folder: str) -> None:  # pragma: no cover
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config()).to(torch.float16)
    model.save_pretrained(folder, max_shard_size="20MB")
    with torch.no_grad():
        logits = model.cuda()(_ids().cuda()).logits.float().cpu()
    torch.save(logits, os.path.join(folder, "float_logits.pt"))


def _load(lib: str, mode: str, folder: str) -> dict:  # pragma: no cover
    import time

    import torch
    from transformers import LlamaForCausalLM

    if lib == "accel_nb":
        from accel_nb import init_empty_weights
        from accel_nb.utils import BnbQuantizationConfig, load_and_quantize_model
    else:
        from accelerate import init_empty_weights
        from accelerate.utils import BnbQuantizationConfig, load_and_quantize_model

    kwargs = (
        {"load_in_8bit": True}
        if mode == "8bit"
        else {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": torch.float16}
    )
    with init_empty_weights():
        model = LlamaForCausalLM(_config())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    model = load_and_quantize_model(
        model,
        BnbQuantizationConfig(torch_dtype=torch.float16, **kwargs),
        weights_location=folder,
        device_map={"": 0},
    )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    held = (torch.cuda.memory_allocated() - base) / 2**20
    with torch.no_grad():
        logits = model(_ids().cuda()).logits.float().cpu()
    torch.save(logits, os.path.join(folder, f"{lib}_{mode}.pt"))
    ref = torch.load(os.path.join(folder, "float_logits.pt"))
    return {
        "load_s": seconds,
        "gpu_mib": held,
        "max_abs_vs_float": float((logits - ref).abs().max()),
        "float_logit_scale": float(ref.abs().max()),
    }


def _child(code: str, timeout: int = 240) -> dict:
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import json, sys; sys.path.insert(0, {ROOT!r}); "
            f"sys.path.insert(0, {os.path.join(ROOT, 'scripts')!r}); import gpu_check_quantization as q; "
            f"print('@@' + json.dumps({code}) + '@@')",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if "@@" not in res.stdout:
        return {"error": (res.stderr or res.stdout)[-1500:]}
    return json.loads(res.stdout.split("@@")[1])


def rows(data: dict) -> list[dict]:
    """Benchmark rows (docs/benchmarks.md) from what ``main`` wrote."""
    out = []
    for mode in MODES:
        ours, ref = data.get(f"accel_nb_{mode}", {}), data.get(f"accelerate_{mode}", {})
        note = "Llama-style 8 layers x 1024 (fp16 checkpoint in 20 MB shards), bitsandbytes, whole model on one GPU"
        if "error" in ours:
            last = ours["error"].strip().splitlines()[-1][:200] if ours["error"].strip() else "no output"
            out.append(
                {
                    "benchmark": "quantized_gpu",
                    "metric": f"{mode} load",
                    "accel_nb": None,
                    "reference": None,
                    "ratio": None,
                    "unit": "s",
                    "note": "FAILED: " + last,
                }
            )
            continue
        agree = data.get(f"agree_{mode}")
        extra = f"; logits vs float max abs {ours['max_abs_vs_float']:.3g} (logit scale {ours['float_logit_scale']:.3g})"
        extra += (
            f"; vs the reference's logits max abs {agree:.3g}"
            if agree is not None
            else f"; reference: {(ref.get('error') or 'not run').strip().splitlines()[-1][:120]}"
        )
        out.append(
            {
                "benchmark": "quantized_gpu",
                "metric": f"{mode} load_and_quantize_model time",
                "accel_nb": ours["load_s"],
                "reference": ref.get("load_s"),
                "ratio": ours["load_s"] / ref["load_s"] if ref.get("load_s") else None,
                "unit": "s",
                "note": note + extra,
            }
        )
        out.append(
            {
                "benchmark": "quantized_gpu",
                "metric": f"{mode} GPU memory held after load",
                "accel_nb": ours["gpu_mib"],
                "reference": ref.get("gpu_mib"),
                "ratio": ours["gpu_mib"] / ref["gpu_mib"] if ref.get("gpu_mib") else None,
                "unit": "MiB",
                "note": note,
            }
        )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    data: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        saved = _child(f"(q._save({folder!r}) or {{}})")
        if "error" in saved:
            data["error"] = saved["error"]
        else:
            for mode in MODES:
                for lib in ("accel_nb", "accelerate"):
                    data[f"{lib}_{mode}"] = _child(f"q._load({lib!r}, {mode!r}, {folder!r})")
                a, b = (
                    os.path.join(folder, f"accel_nb_{mode}.pt"),
                    os.path.join(folder, f"accelerate_{mode}.pt"),
                )
                if os.path.exists(a) and os.path.exists(b):
                    import torch

                    data[f"agree_{mode}"] = float((torch.load(a) - torch.load(b)).abs().max())
    with open(argv[0], "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    print(json.dumps(data, indent=1)[:4000])
    return (
        0
        if "error" not in data and all("error" not in data.get(f"accel_nb_{m}", {"error": 1}) for m in MODES)
        else 1
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
