"""gpu_check step: one GPU, DeepSpeed ZeRO-2 with the optimizer offloaded to the CPU (the single-GPU case
users run to fit a bigger model), accel_nb and the reference library on the same config, model and data.

    python scripts/gpu_check_deepspeed.py OUT.json          # runs both libraries, each in a fresh process
    GPU_CHECK_DS_TINY=1 python scripts/gpu_check_deepspeed.py OUT.json   # a tiny GPT-2 on the CPU: the logic

Each run is a fresh one-process "distributed" job (RANK=0, WORLD_SIZE=1): GPT-2 small built from a
config (no download), bf16, a torch AdamW whose state lives on the CPU. The libraries run in the order
accel_nb, reference, reference, accel_nb, so a library's figure is not the order's (a first process on
a fresh machine can pay for memory the later ones find ready). Per run:
- the timed pass: ``STEPS`` steps, a CUDA synchronisation only at each step's ends; median step time
  after ``WARMUP``, the main thread's CPU time per step (Python and the CPU optimizer's calling thread),
  the losses (both libraries must agree: same seed, same data), peak GPU memory;
- a diagnostic pass after it: ``DIAG_STEPS`` more steps with a synchronisation between phases, the
  times of forward, ``engine.backward``, ``engine.step`` (the reduce, clip and CPU AdamW), the rest of
  ``accelerator.backward`` (the library's own work around the engine) and ``optimizer.step`` +
  ``zero_grad`` (no-ops under DeepSpeed); never mixed into the timed figures;
- what could differ between the libraries without changing a loss: the DeepSpeed config the engine got,
  forward hooks on the model, autocast state during forward, CPU threads, Python threads.
Needs deepspeed (pure Python with DS_BUILD_OPS=0) and transformers.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.environ.get("GPU_CHECK_DS_TINY") == "1"  # the CPU-side check: a 2-layer GPT-2, DeepSpeed on the CPU
STEPS, WARMUP, DIAG_STEPS = 12, 3, 4
BATCH, SEQ = (2, 32) if TINY else (8, 256)
ORDER = ("accel_nb", "reference", "reference", "accel_nb")
PHASES = ("forward", "engine_backward", "engine_step", "around_engine", "optimizer_calls")

CONFIG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": not TINY}},
    # the client's torch AdamW runs on the offloaded partitions (no compiled DeepSpeedCPUAdam needed)
    "zero_force_ds_cpu_optimizer": False,
    "zero_allow_untested_optimizer": True,
}


def _body(lib: str) -> dict:  # pragma: no cover - runs on a GPU machine (or the CPU with GPU_CHECK_DS_TINY=1)
    import threading
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if lib == "accel_nb":
        from accel_nb import Accelerator, DeepSpeedPlugin
    else:
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin

    cuda = torch.cuda.is_available() and not TINY

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch.manual_seed(0)
    options = {"cpu": True} if TINY else {}
    acc = Accelerator(
        mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=dict(CONFIG)), **options
    )
    size = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512} if TINY else {}
    model = GPT2LMHeadModel(GPT2Config(n_positions=SEQ, **size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, vocab, (BATCH, SEQ), generator=g) for _ in range(STEPS + DIAG_STEPS)]
    model, opt = acc.prepare(model, opt)
    engine = getattr(acc.deepspeed_engine_wrapped, "engine", None)
    if engine is None:  # the reference on the CPU trains without DeepSpeed (see docs/deepspeed.md)
        raise RuntimeError(f"{lib} prepared no DeepSpeed engine on {acc.device}")
    seen: dict = {}

    def look(_module, _args, _kwargs):  # what the forward runs under (after every other pre-hook)
        seen["autocast_cuda"] = torch.is_autocast_enabled("cuda")
        seen["autocast_cpu"] = torch.is_autocast_enabled("cpu")

    hooks_before = {
        "forward_pre_hooks": len(engine.module._forward_pre_hooks),
        "forward_hooks": len(engine.module._forward_hooks),
        "engine_forward_pre_hooks": len(engine._forward_pre_hooks),
    }
    engine.module.register_forward_pre_hook(look, with_kwargs=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses, times, cpu_times = [], [], []
    for ids in data[:STEPS]:
        ids = ids.to(acc.device)
        sync()
        start, cpu_start = time.perf_counter(), time.thread_time()
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        sync()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu_start)
        losses.append(float(loss))

    # the diagnostic pass: synchronised between phases, so its times add up differently from the timed pass
    inner = {"engine_backward": [], "engine_step": []}

    def timed(name, fn):
        def run(*args, **kwargs):
            sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            inner[name].append(time.perf_counter() - start)
            return out

        return run

    engine.backward = timed("engine_backward", engine.backward)  # both libraries call these on the instance
    engine.step = timed("engine_step", engine.step)
    phases: dict = {name: [] for name in PHASES}
    for ids in data[STEPS:]:
        ids = ids.to(acc.device)
        sync()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        sync()
        t1 = time.perf_counter()
        n_bwd, n_step = len(inner["engine_backward"]), len(inner["engine_step"])
        acc.backward(loss)
        sync()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        sync()
        t3 = time.perf_counter()
        bwd = sum(inner["engine_backward"][n_bwd:])
        stp = sum(inner["engine_step"][n_step:])
        phases["forward"].append(t1 - t0)
        phases["engine_backward"].append(bwd)
        phases["engine_step"].append(stp)
        phases["around_engine"].append(t2 - t1 - bwd - stp)
        phases["optimizer_calls"].append(t3 - t2)
    config = getattr(acc, "deepspeed_config", None) or {}
    return {
        "lib": lib,
        "step_s": statistics.median(times[WARMUP:]),
        "step_times": times,
        "cpu_s": statistics.median(cpu_times[WARMUP:]),
        "losses": losses,
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0,
        "device": str(acc.device),
        "phases_s": {name: statistics.median(values) for name, values in phases.items()},
        "settings": {
            **hooks_before,
            **seen,
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "python_threads": sorted(t.name for t in threading.enumerate()),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "engine_bf16": bool(getattr(engine, "bfloat16_enabled", lambda: None)()),
            "optimizer": type(engine.optimizer).__name__,
        },
        "ds_config": json.loads(json.dumps(config, default=str)),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(lib: str) -> dict:
    env = dict(
        os.environ,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    if TINY:
        env["DS_ACCELERATOR"] = "cpu"
    code = (
        f"import json, sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'scripts')!r}); "
        f"import gpu_check_deepspeed as g; print('@@' + json.dumps(g._body({lib!r})) + '@@')"
    )
    try:
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return {"lib": lib, "error": "did not finish within 300 s"}
    out = res.stdout
    if "@@" not in out:
        return {"lib": lib, "error": (res.stderr or out)[-1500:]}
    return json.loads(out.split("@@")[1])


def combine(runs: list[dict]) -> dict:
    """One library's figures from its runs: medians of the runs' medians, the first run's losses."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0] if runs else {"error": "not run"}
    first = good[0]
    out = dict(first)
    out["step_s"] = statistics.median(r["step_s"] for r in good)
    out["runs_step_s"] = [r["step_s"] for r in good]
    out["cpu_s"] = statistics.median(r.get("cpu_s", 0.0) for r in good)
    out["peak_gpu_mib"] = max(r["peak_gpu_mib"] for r in good)
    if all("phases_s" in r for r in good):
        out["phases_s"] = {k: statistics.median(r["phases_s"][k] for r in good) for k in first["phases_s"]}
    out["losses_agree_across_runs"] = all(r["losses"] == first["losses"] for r in good)
    return out


def config_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two DeepSpeed configs (missing counts as different)."""
    diffs = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            diffs += config_differences(x, y, prefix + key + ".")
        elif x != y:
            diffs.append(f"{prefix}{key}: {x!r} vs {y!r}")
    return diffs


def setting_differences(a: dict, b: dict) -> list[str]:
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def rows(data: dict) -> list[dict]:
    """The benchmark rows of ``data`` (as written by ``main``) for docs/benchmarks.md."""
    ours, ref = data.get("accel_nb", {}), data.get("reference", {})
    note = (
        f"GPT-2 small, bf16, batch {BATCH}x{SEQ}, ZeRO-2, optimizer (torch AdamW) offloaded to CPU, one GPU"
    )
    if "error" in ours:
        last = ours["error"].strip().splitlines()[-1][:200] if ours["error"].strip() else "no output"
        return [
            {
                "benchmark": "deepspeed_gpu",
                "metric": "ZeRO-2 optimizer-offload step",
                "accel_nb": None,
                "reference": None,
                "ratio": None,
                "unit": "s",
                "note": "FAILED: " + last,
            }
        ]
    theirs = ref.get("step_s")
    same = None
    if "losses" in ref:
        same = max(abs(a - b) for a, b in zip(ours["losses"], ref["losses"]))
    extra = (
        f"; largest loss difference vs reference over {STEPS} steps: {same:.2e}"
        if same is not None
        else f"; reference: {ref.get('error', '').strip().splitlines()[-1][:120] if ref.get('error') else 'not run'}"
    )
    order = data.get("order")
    if order and "runs_step_s" in ours:
        per = {"accel_nb": iter(ours["runs_step_s"]), "reference": iter(ref.get("runs_step_s", []))}
        seq = ", ".join(f"{lib} {next(per[lib], float('nan')):.4f}" for lib in order)
        extra += f"; runs in order (median step s): {seq}"
    out = [
        {
            "benchmark": "deepspeed_gpu",
            "metric": "ZeRO-2 optimizer-offload step time (median)",
            "accel_nb": ours["step_s"],
            "reference": theirs,
            "ratio": ours["step_s"] / theirs if theirs else None,
            "unit": "s",
            "note": note + extra,
        },
        {
            "benchmark": "deepspeed_gpu",
            "metric": "ZeRO-2 optimizer-offload peak GPU memory",
            "accel_nb": ours["peak_gpu_mib"],
            "reference": ref.get("peak_gpu_mib"),
            "ratio": ours["peak_gpu_mib"] / ref["peak_gpu_mib"] if ref.get("peak_gpu_mib") else None,
            "unit": "MiB",
            "note": note,
        },
    ]
    if "cpu_s" in ours and ref.get("cpu_s"):
        out.append(
            {
                "benchmark": "deepspeed_gpu",
                "metric": "ZeRO-2 optimizer-offload main-thread CPU time per step (median)",
                "accel_nb": ours["cpu_s"],
                "reference": ref["cpu_s"],
                "ratio": ours["cpu_s"] / ref["cpu_s"],
                "unit": "s",
                "note": "time.thread_time over the timed step: Python work and the CPU optimizer's calling thread",
            }
        )
    if "phases_s" in ours and "phases_s" in ref:
        diffs = config_differences(ours.get("ds_config", {}), ref.get("ds_config", {}))
        settings = setting_differences(ours.get("settings", {}), ref.get("settings", {}))
        for name in PHASES:
            a, b = ours["phases_s"][name], ref["phases_s"][name]
            out.append(
                {
                    "benchmark": "deepspeed_gpu",
                    "metric": f"ZeRO-2 optimizer-offload diagnostic pass: {name.replace('_', ' ')} (median)",
                    "accel_nb": a,
                    "reference": b,
                    "ratio": a / b if b > 1e-6 else None,
                    "unit": "s",
                    "note": f"{DIAG_STEPS} steps after the timed ones, synchronised between phases (not the timed pass)"
                    + (
                        "; DeepSpeed config differences: " + "; ".join(diffs)[:300]
                        if diffs and name == PHASES[0]
                        else ""
                    )
                    + (
                        "; other differences: " + "; ".join(settings)[:300]
                        if settings and name == PHASES[0]
                        else ""
                    ),
                }
            )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import accelerate  # noqa: F401

        have_reference = True
    except ImportError:
        have_reference = False
    runs: dict[str, list[dict]] = {"accel_nb": [], "reference": []}
    for lib in ORDER:
        if lib == "reference" and not have_reference:
            continue
        runs[lib].append(_run(lib))
        last = runs[lib][-1]
        print(
            f"gpu_check_deepspeed: {lib} run {len(runs[lib])}: "
            + (f"{last['step_s']:.4f} s/step" if "error" not in last else "FAILED"),
            flush=True,
        )
    data = {
        "order": [lib for lib in ORDER if have_reference or lib == "accel_nb"],
        "accel_nb": combine(runs["accel_nb"]),
        "reference": combine(runs["reference"])
        if have_reference
        else {"error": "accelerate is not installed"},
        "runs": runs,
    }
    with open(argv[0], "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    summary = {k: v for k, v in data.items() if k != "runs"}
    print(json.dumps(summary, indent=1)[:6000])
    for row in rows(data):
        print(
            f"{row['metric']}: {row['accel_nb']} vs {row['reference']} (ratio {row['ratio']}) {row['note'][-300:]}"
        )
    return 0 if "error" not in data["accel_nb"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
