"""gpu_check step: bitsandbytes 8-bit and 4-bit (NF4) loading on one GPU, accel_nb's
``load_and_quantize_model`` side by side with the reference library's on the same checkpoint.

    python scripts/gpu_check_quantization.py OUT.json

A Llama-style model built from a config (no download) is saved as sharded safetensors; each library
loads it quantized onto the GPU in a fresh process. The figures: load time, GPU memory held after the
load, and the logits of a fixed batch compared with the float model's (max abs difference) and with
the other library's (they use the same bitsandbytes kernels, so they should agree closely).

Then torchao weight-only int8 and int4 (accel_nb only: the reference's loader has no torchao path):
the same checkpoint loaded onto the GPU in bfloat16 with ``TorchAoQuantizationConfig``, against
torchao's ``quantize_`` applied by hand to the bfloat16 model (same layers, same layout): load time,
memory held, logits against the hand-quantized model's (expected equal) and the float model's.

Then NF4 offloaded generation (accel_nb only): blocks 4-5 mapped to "cpu" and 6-7 to "disk", the
rest on GPU 0; the offloaded quantized layers are streamed to the GPU in their quantized form. The
figures: logits compared with the same NF4 model loaded whole onto the GPU (expected equal), greedy
tokens the same, bytes streamed per generated token and tokens/s, against the float16 model
offloaded with the same map (load_checkpoint_and_dispatch).

Not run by default (GPU_CHECK_QUANT_PARTS=offload_diag): where the NF4 offload's time goes, at
1024 width. Blocks 4-7 all on "cpu", then all on "disk", NF4 and float16; the disk variants again
with a 0.1 ms GIL switch interval (the engine reads disk units on a worker thread, which needs the
GIL between its copies while the main thread launches kernels); and the synchronizing CUDA calls per
generated token (torch.cuda.set_sync_debug_mode), NF4 offloaded vs NF4 whole on the GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("8bit", "nf4")


def _config(big: bool = False):  # pragma: no cover - runs on a GPU machine
    """Llama-style, 8 layers: 1024 wide (25 MB per layer in fp16), or 4096 wide (405 MB, a 7B's layer)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4096 if big else 1024,
        intermediate_size=11008 if big else 2816,
        num_hidden_layers=8,
        num_attention_heads=32 if big else 16,
        num_key_value_heads=32 if big else 16,
        vocab_size=8192,
        max_position_embeddings=256,
    )


def _ids():  # pragma: no cover
    import torch

    return torch.randint(0, 8192, (2, 64), generator=torch.Generator().manual_seed(0))


def _save(folder: str, big: bool = False) -> None:  # pragma: no cover
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(_config(big)).to(torch.float16)
    model.save_pretrained(folder, max_shard_size="1GB" if big else "20MB")
    if big:
        return
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


def _torchao(weight: str, folder: str) -> dict:  # pragma: no cover
    """accel_nb's torchao load on cuda:0 vs torchao's quantize_ on the float model, by hand."""
    import time

    import torch
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    from transformers import LlamaForCausalLM

    from accel_nb import init_empty_weights
    from accel_nb.big_model.quantization import TorchAoQuantizationConfig, load_and_quantize_model

    with init_empty_weights():
        model = LlamaForCausalLM(_config())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    model = load_and_quantize_model(
        model,
        TorchAoQuantizationConfig(weight, torch_dtype=torch.bfloat16),
        weights_location=folder,
        device_map={"": 0},
    )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    held = (torch.cuda.memory_allocated() - base) / 2**20
    kinds = sorted({type(m.weight).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)})
    with torch.no_grad():
        ours = model(_ids().cuda()).logits.float().cpu()
    del model
    torch.cuda.empty_cache()
    start = time.perf_counter()
    hand = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda()
    ao = (
        Int8WeightOnlyConfig()
        if weight == "int8"
        else Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
    )
    quantize_(hand, ao, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn != "lm_head")
    torch.cuda.synchronize()
    hand_s = time.perf_counter() - start
    with torch.no_grad():
        theirs = hand(_ids().cuda()).logits.float().cpu()
    ref = torch.load(os.path.join(folder, "float_logits.pt"))
    return {
        "load_s": seconds,
        "gpu_mib": held,
        "weight_types": kinds,
        "hand_quantize_s": hand_s,
        "max_abs_vs_hand": float((ours - theirs).abs().max()),
        "max_abs_vs_float": float((ours - ref).abs().max()),
        "float_logit_scale": float(ref.abs().max()),
    }


def _offload_map(gpu, where: str | None = None):
    """Blocks 0-3 and the rest on ``gpu``; blocks 4-5 on "cpu" and 6-7 on "disk", or 4-7 all on ``where``."""
    dmap = {"model.embed_tokens": gpu, "model.rotary_emb": gpu, "model.norm": gpu, "lm_head": gpu}
    for i in range(8):
        offloaded = where if where is not None else ("cpu" if i in (4, 5) else "disk")
        dmap[f"model.layers.{i}"] = offloaded if i >= 4 else gpu
    return dmap


def _empty_llama(big: bool = False):  # pragma: no cover
    """The test model's shell on the meta device (``_config``), in eval mode."""
    from transformers import LlamaForCausalLM

    from accel_nb import init_empty_weights

    with init_empty_weights():
        return LlamaForCausalLM(_config(big)).eval()


def _nf4_config():  # pragma: no cover
    """NF4 weights, float16 compute and non-quantized tensors: the offload checks' 4-bit config."""
    import torch

    from accel_nb.utils import BnbQuantizationConfig

    return BnbQuantizationConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float16,
        torch_dtype=torch.float16,
    )


def _generation(model, prompt, new_tokens: int, sync, counter=lambda: 0):  # pragma: no cover
    """(tokens/s, growth of ``counter()`` per token, the tokens) of greedy generation, after a 2-token warm-up."""
    import time

    import torch

    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, do_sample=False)  # warm-up
        sync()
        before, start = counter(), time.perf_counter()
        tokens = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        sync()
        seconds = time.perf_counter() - start
    return new_tokens / seconds, (counter() - before) / new_tokens, tokens


def _offload(
    folder: str, device: str = "cuda:0", new_tokens: int = 16, big: bool = False
) -> dict:  # pragma: no cover
    """NF4 with blocks on cpu and disk vs NF4 whole on the device, and vs the float16 offload (same map)."""
    import tempfile

    import torch

    from accel_nb import load_checkpoint_and_dispatch
    from accel_nb.utils import load_and_quantize_model

    gpu = 0 if device.startswith("cuda") else "cpu"
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def streamed(model):
        """Bytes copied to the execution device: the engine counts float and quantized units alike
        (the quantized layers are units of the same engine); on a CPU run only the offloader counts."""
        engine = getattr(model, "_accel_nb_engine", None)
        if engine is not None and engine.buffered:
            return engine.bytes_streamed
        offloader = getattr(model, "_accel_nb_quantized_offloader", None)
        return offloader.bytes_moved if offloader is not None else 0

    def run(model):
        with torch.no_grad():
            logits = model(_ids().to(device)).logits.float().cpu()
        prompt = _ids()[:1, :16].to(device)
        rate, per_token, tokens = _generation(model, prompt, new_tokens, sync, lambda: streamed(model))
        return logits, tokens.cpu(), per_token, rate

    whole = load_and_quantize_model(
        _empty_llama(big), _nf4_config(), weights_location=folder, device_map={"": gpu}
    )
    logits_whole, tokens_whole, _, _ = run(whole)
    del whole
    with tempfile.TemporaryDirectory() as off:
        model = load_and_quantize_model(
            _empty_llama(big),
            _nf4_config(),
            weights_location=folder,
            device_map=_offload_map(gpu),
            offload_folder=off,
        )
        logits, tokens, q_bytes, q_rate = run(model)
        del model
    with tempfile.TemporaryDirectory() as off:
        model = load_checkpoint_and_dispatch(
            _empty_llama(big), folder, device_map=_offload_map(gpu), offload_folder=off, dtype=torch.float16
        )
        _, _, f_bytes, f_rate = run(model)
        del model
    # the reference with the same 4-bit config and map: it keeps cpu/disk modules unquantized (in
    # torch_dtype) and offloads them with its own hooks (not run on a GPU yet: added after the last call)
    ref_rate, ref_error = None, None
    try:
        from accelerate import init_empty_weights as ref_empty
        from accelerate.utils import BnbQuantizationConfig as RefConfig
        from accelerate.utils import load_and_quantize_model as ref_load
        from transformers import LlamaForCausalLM

        with ref_empty():
            shell = LlamaForCausalLM(_config(big)).eval()
        ref_config = RefConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float16,
            torch_dtype=torch.float16,
        )
        with tempfile.TemporaryDirectory() as off:
            model = ref_load(
                shell, ref_config, weights_location=folder, device_map=_offload_map(gpu), offload_folder=off
            )
            _, _, _, ref_rate = run(model)
            del model
    except Exception as exc:  # noqa: BLE001 - recorded for the report
        ref_error = (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        )
    return {
        "reference_tokens_per_s": ref_rate,
        "reference_error": ref_error,
        "logits_equal": bool(torch.equal(logits, logits_whole)),
        "max_abs_vs_whole": float((logits - logits_whole).abs().max()),
        "same_tokens": bool(torch.equal(tokens, tokens_whole)),
        "nf4_bytes_per_token": q_bytes,
        "nf4_tokens_per_s": q_rate,
        "fp16_bytes_per_token": f_bytes,
        "fp16_tokens_per_s": f_rate,
    }


def _offload_diag(folder: str, device: str = "cuda:0", new_tokens: int = 16) -> dict:  # pragma: no cover
    """Tokens/s of NF4 and float16 with blocks 4-7 all on "cpu" or all on "disk" (disk again with a
    0.1 ms GIL switch interval), and synchronizing CUDA calls per generated token."""
    import warnings

    import torch

    from accel_nb import load_checkpoint_and_dispatch
    from accel_nb.utils import load_and_quantize_model

    cuda = device.startswith("cuda")
    gpu = 0 if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    prompt = _ids()[:1, :16].to(device)

    def load(kind, where, off):
        dmap = _offload_map(gpu, where)
        if kind == "fp16":
            return load_checkpoint_and_dispatch(
                _empty_llama(), folder, device_map=dmap, offload_folder=off, dtype=torch.float16
            )
        return load_and_quantize_model(
            _empty_llama(), _nf4_config(), weights_location=folder, device_map=dmap, offload_folder=off
        )

    def rate(model):
        return _generation(model, prompt, new_tokens, sync)[0]

    def syncs_per_token(model):
        if not cuda:
            return None
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught) / 4

    out: dict = {}
    default_switch = sys.getswitchinterval()
    for where in ("cpu", "disk"):
        for kind in ("nf4", "fp16"):
            for switch in (None, 1e-4) if where == "disk" else (None,):
                with tempfile.TemporaryDirectory() as off:
                    model = load(kind, where, off)
                    if switch:
                        sys.setswitchinterval(switch)
                    try:
                        tokens_per_s = rate(model)
                    finally:
                        sys.setswitchinterval(default_switch)
                    key = f"{kind}_{where}" + ("_switch" if switch else "")
                    out[key] = {
                        "tokens_per_s": tokens_per_s,
                        "syncs_per_token": None if switch else syncs_per_token(model),
                    }
                    del model
    whole = load("nf4", gpu, None)
    out["nf4_whole"] = {"tokens_per_s": rate(whole), "syncs_per_token": syncs_per_token(whole)}
    return out


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
        if not ours:  # not run (GPU_CHECK_QUANT_PARTS)
            continue
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
    for weight in ("int8", "int4"):
        ao = data.get(f"torchao_{weight}")
        if ao is None:
            continue
        note = "Llama-style 8 layers x 1024 (fp16 checkpoint in 20 MB shards), bf16, whole model on one GPU; "
        if "error" in ao:
            last = ao["error"].strip().splitlines()[-1][:200] if ao["error"].strip() else "no output"
            out.append(_plain(f"torchao {weight} load", None, None, "s", "FAILED: " + last))
            continue
        note += (
            f"weights {', '.join(ao['weight_types'])}; logits vs torchao's quantize_ by hand max abs "
            f"{ao['max_abs_vs_hand']:.3g}, vs float {ao['max_abs_vs_float']:.3g} (logit scale "
            f"{ao['float_logit_scale']:.3g}); reference column: by hand, from_pretrained(bf16) + .cuda() + quantize_"
        )
        out.append(
            _plain(
                f"torchao {weight} load_and_quantize_model time",
                ao["load_s"],
                ao["hand_quantize_s"],
                "s",
                note,
            )
        )
        out.append(_plain(f"torchao {weight} GPU memory held after load", ao["gpu_mib"], None, "MiB", note))
    for key, width in (("offload_nf4", "1024"), ("offload_nf4_big", "4096 (a 7B's layers)")):
        off = data.get(key)
        if off is None:
            continue
        note = f"Llama-style 8 layers x {width}, blocks 4-5 on cpu and 6-7 on disk, GPU 0 runs all; "
        if "error" in off:
            last = off["error"].strip().splitlines()[-1][:200] if off["error"].strip() else "no output"
            out.append(
                _plain(f"nf4 offloaded generation, width {width}", None, None, "MiB", "FAILED: " + last)
            )
        else:
            note += (
                f"vs NF4 whole on the GPU: logits equal {off['logits_equal']} (max abs {off['max_abs_vs_whole']:.3g}), "
                f"same greedy tokens {off['same_tokens']}; reference column: float16 offload, same map"
            )
            out.append(
                _plain(
                    f"nf4 offloaded generation, width {width}: bytes streamed per token",
                    off["nf4_bytes_per_token"] / 2**20,
                    off["fp16_bytes_per_token"] / 2**20,
                    "MiB",
                    note,
                )
            )
            if off.get("reference_tokens_per_s") or off.get("reference_error"):
                out.append(
                    _plain(
                        f"nf4 offloaded generation, width {width}: tokens/s vs the reference",
                        off["nf4_tokens_per_s"],
                        off.get("reference_tokens_per_s"),
                        "tokens/s",
                        "reference: its load_and_quantize_model, same NF4 config and map (it keeps cpu/disk modules "
                        "in float16, offloaded by its hooks)"
                        + (
                            f"; reference failed: {off['reference_error']}"
                            if off.get("reference_error")
                            else ""
                        ),
                    )
                )
            out.append(
                _plain(
                    f"nf4 offloaded generation, width {width}: tokens/s",
                    off["nf4_tokens_per_s"],
                    off["fp16_tokens_per_s"],
                    "tokens/s",
                    note,
                )
            )
    diag = data.get("offload_diag")
    if diag is not None and "error" in diag:
        last = diag["error"].strip().splitlines()[-1][:200] if diag["error"].strip() else "no output"
        out.append(_plain("nf4 offload diagnosis, width 1024", None, None, "tokens/s", "FAILED: " + last))
    elif diag is not None:
        for key, r in diag.items():
            kind, _, rest = key.partition("_")
            where = {"whole": "the whole model on the GPU"}.get(
                rest, "blocks 4-7 on " + rest.replace("_switch", "")
            )
            note = "Llama-style 8 layers x 1024; offload_diag part"
            if rest.endswith("_switch"):
                note += "; sys.setswitchinterval(1e-4) while generating"
            if r.get("syncs_per_token") is not None:
                note += f"; {r['syncs_per_token']:.1f} synchronizing CUDA calls per token"
            out.append(
                _plain(
                    f"offload diagnosis: {kind}, {where}"
                    + (", GIL switch 0.1 ms" if rest.endswith("_switch") else "")
                    + ": tokens/s",
                    r["tokens_per_s"],
                    None,
                    "tokens/s",
                    note,
                )
            )
    return out


def _plain(metric: str, ours, ref, unit: str, note: str) -> dict:
    return {
        "benchmark": "quantized_gpu",
        "metric": metric,
        "accel_nb": ours,
        "reference": ref,
        "ratio": ours / ref if ours is not None and ref else None,
        "unit": unit,
        "note": note,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    # GPU_CHECK_QUANT_PARTS: a comma list of bnb,torchao,offload,offload_big,offload_diag to run only
    # those (default: all but offload_diag)
    parts = set((os.environ.get("GPU_CHECK_QUANT_PARTS") or "bnb,torchao,offload,offload_big").split(","))
    data: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        saved = _child(f"(q._save({folder!r}) or {{}})") if parts - {"offload_big"} else {}
        if "error" in saved:
            data["error"] = saved["error"]
        else:
            for mode in MODES if "bnb" in parts else ():
                for lib in ("accel_nb", "accelerate"):
                    data[f"{lib}_{mode}"] = _child(f"q._load({lib!r}, {mode!r}, {folder!r})")
                a, b = (
                    os.path.join(folder, f"accel_nb_{mode}.pt"),
                    os.path.join(folder, f"accelerate_{mode}.pt"),
                )
                if os.path.exists(a) and os.path.exists(b):
                    import torch

                    data[f"agree_{mode}"] = float((torch.load(a) - torch.load(b)).abs().max())
            for weight in ("int8", "int4") if "torchao" in parts else ():
                data[f"torchao_{weight}"] = _child(f"q._torchao({weight!r}, {folder!r})")
            if "offload" in parts:
                data["offload_nf4"] = _child(f"q._offload({folder!r})", timeout=420)
            if "offload_diag" in parts:
                data["offload_diag"] = _child(f"q._offload_diag({folder!r})", timeout=420)
    if "offload_big" in parts:
        with tempfile.TemporaryDirectory() as big:
            saved = _child(f"(q._save({big!r}, big=True) or {{}})")
            data["offload_nf4_big"] = (
                saved if "error" in saved else _child(f"q._offload({big!r}, big=True)", 420)
            )
    with open(argv[0], "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    print(json.dumps(data, indent=1)[:4000])
    return (
        0
        if "error" not in data
        and all("error" not in data.get(f"accel_nb_{m}", {}) for m in MODES)
        and "error" not in data.get("offload_nf4", {})
        and "error" not in data.get("offload_nf4_big", {})
        and "error" not in data.get("offload_diag", {})
        and all("error" not in data.get(f"torchao_{w}", {}) for w in ("int8", "int4"))
        else 1
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
