"""gpu_check step: one GPU, DeepSpeed ZeRO-2 with the optimizer offloaded to the CPU (the single-GPU case
users run to fit a bigger model), accel_nb and the reference library on the same config, model and data.

    python scripts/gpu_check_deepspeed.py OUT.json          # runs both libraries, each in a fresh process

Each library runs in a process of its own as a one-process "distributed" job (RANK=0, WORLD_SIZE=1),
GPT-2 small built from a config (no download), bf16, a torch AdamW whose state lives on the CPU. The
figures: median step time, the losses of every step (both libraries must agree: same seed, same
data), peak GPU memory. Needs deepspeed (pure Python with DS_BUILD_OPS=0) and transformers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, WARMUP, BATCH, SEQ = 12, 3, 8, 256

CONFIG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
    # the client's torch AdamW runs on the offloaded partitions (no compiled DeepSpeedCPUAdam needed)
    "zero_force_ds_cpu_optimizer": False,
    "zero_allow_untested_optimizer": True,
}


def _body(lib: str) -> dict:  # pragma: no cover - runs on a GPU machine
    import statistics
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if lib == "accel_nb":
        from accel_nb import Accelerator, DeepSpeedPlugin
    else:
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin

    torch.manual_seed(0)
    acc = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=dict(CONFIG)))
    model = GPT2LMHeadModel(GPT2Config(n_positions=SEQ))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 50257, (BATCH, SEQ), generator=g) for _ in range(STEPS)]
    model, opt = acc.prepare(model, opt)
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for ids in data:
        ids = ids.to(acc.device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    return {
        "lib": lib,
        "step_s": statistics.median(times[WARMUP:]),
        "losses": losses,
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
        "device": str(acc.device),
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
    return [
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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    data = {"accel_nb": _run("accel_nb")}
    try:
        import accelerate  # noqa: F401

        data["reference"] = _run("accelerate")
    except ImportError:
        data["reference"] = {"error": "accelerate is not installed"}
    with open(argv[0], "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    print(json.dumps(data, indent=1)[:4000])
    return 0 if "error" not in data["accel_nb"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
