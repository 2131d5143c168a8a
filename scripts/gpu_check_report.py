"""Helpers of scripts/gpu_check.sh: a one-GPU notebook_launcher run in a real kernel, and the
"GPU run" section of docs/benchmarks.md.

    python scripts/gpu_check_report.py kernel-launch OUT.json
    python scripts/gpu_check_report.py refusal OUT.json
    python scripts/gpu_check_report.py write docs/benchmarks.md OUT_DIR PYTEST_RC
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

BEGIN, END = "<!-- gpu-run:begin -->", "<!-- gpu-run:end -->"

# One cell: the same tiny bf16 training function launched twice on one GPU (the second launch is
# the steady state). With accel_nb the kernel itself never touches CUDA; the reference runs a
# one-process launch inside the kernel.
CELL = r"""
import json, time, torch
from LIB import Accelerator, notebook_launcher
box = {}

def train():
    acc = Accelerator(mixed_precision="bf16")
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(64, 512, device=acc.device)
    for _ in range(20):
        loss = model(x).float().pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    box["result"] = {"device": str(acc.device), "processes": acc.num_processes, "loss": float(loss)}
    return box["result"]

times = []
for _ in range(2):
    t0 = time.perf_counter()
    results = notebook_launcher(train, num_processes=1)
    times.append(time.perf_counter() - t0)
result = results[0] if isinstance(results, list) else box.get("result")
print("@@" + json.dumps({"times": times, "result": result, "cuda_in_kernel": torch.cuda.is_initialized()}) + "@@")
"""
OURS = CELL.replace("LIB", "accel_nb")
REFERENCE = CELL.replace("LIB", "accelerate")


def _run_in_kernel(code: str) -> dict:
    from tests.kernel_helpers import KernelSession

    with KernelSession(cwd=ROOT) as kernel:
        out = kernel.run(f"import sys; sys.path.insert(0, {ROOT!r})\n" + code, timeout=300)
    match = re.search(r"@@(.*)@@", out.stdout)
    if out.error is not None or not match:
        return {"error": (out.traceback or out.text)[-2000:]}
    return json.loads(match.group(1))


def kernel_launch(path: str) -> int:
    """notebook_launcher(num_processes=1) on the GPU from a real kernel; the reference in another kernel."""
    ours = _run_in_kernel(OURS)
    try:
        import accelerate  # noqa: F401

        reference = _run_in_kernel(REFERENCE)
    except ImportError:
        reference = {"error": "accelerate is not installed"}
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"accel_nb": ours, "reference": reference}, f, indent=1)
    print(json.dumps({"accel_nb": ours, "reference": reference}, indent=1))
    return 0 if "error" not in ours and ours["result"]["device"].startswith("cuda") else 1


REFUSAL_NOTEBOOK = r"""
import json, sys, torch
from accel_nb import notebook_launcher
n = torch.cuda.device_count() + 1
try:
    notebook_launcher(lambda: open(sys.argv[1], "w").close(), num_processes=n)
    print(json.dumps({"refused": False}))
except Exception as exc:
    print(json.dumps({"refused": True, "error": f"{type(exc).__name__}: {exc}"}))
"""


def refusal(path: str) -> int:
    """More GPU processes than GPUs, on a real GPU: refused before any rank starts (notebook and CLI faces)."""
    import subprocess
    import tempfile

    import torch

    n = torch.cuda.device_count() + 1
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "ran")
        script = os.path.join(tmp, "train.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(f"open({marker!r}, 'w').close()\n")
        nb = subprocess.run(
            [sys.executable, "-c", REFUSAL_NOTEBOOK, marker], capture_output=True, text=True, timeout=120
        )
        lines = [x for x in nb.stdout.splitlines() if x.startswith("{")]
        notebook = json.loads(lines[-1]) if lines else {"refused": False, "error": nb.stderr[-500:]}
        notebook["rank_ran"] = os.path.exists(marker)
        cli = subprocess.run(
            [sys.executable, "-m", "accel_nb.commands", "launch", "--num_processes", str(n), script],
            capture_output=True,
            text=True,
            timeout=120,
        )
        result = {
            "processes": n,
            "gpus": n - 1,
            "notebook_launcher": notebook,
            "cli": {
                "exit_code": cli.returncode,
                "stderr": cli.stderr.strip()[-600:],
                "rank_ran": os.path.exists(marker),
            },
        }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    ok = (
        notebook["refused"]
        and not notebook["rank_ran"]
        and cli.returncode == 2
        and not result["cli"]["rank_ran"]
    )
    return 0 if ok else 1


def _refusal_line(out_dir: str) -> str:
    path = os.path.join(out_dir, "refusal.json")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        r = json.load(f)
    nb, cli = r["notebook_launcher"], r["cli"]
    ok = nb.get("refused") and not nb.get("rank_ran") and cli["exit_code"] == 2 and not cli["rank_ran"]
    said = (nb.get("error") or "").splitlines()[0][:240] if nb.get("error") else "no error"
    return (
        f"- **{r['processes']} GPU processes on {r['gpus']} GPU(s)**: "
        f"{'refused before any rank started' if ok else 'NOT refused as it should be'} "
        f"(notebook_launcher: `{said}`; `accel-nb launch`: exit code {cli['exit_code']})"
    )


def _kernel_rows(data: dict) -> list[dict]:
    ours, ref = data.get("accel_nb", {}), data.get("reference", {})
    if "error" in ours:
        note = "FAILED: " + ours["error"].strip().splitlines()[-1][:200]
        return [
            {
                "benchmark": "gpu_kernel",
                "metric": "one-GPU notebook_launcher in a real kernel",
                "accel_nb": None,
                "reference": None,
                "ratio": None,
                "unit": "s",
                "note": note,
            }
        ]
    rows = []
    for i, label in enumerate(("first launch", "second launch")):
        mine = ours["times"][i]
        theirs = ref["times"][i] if "times" in ref else None
        rows.append(
            {
                "benchmark": "gpu_kernel",
                "metric": f"one-GPU notebook_launcher in a real kernel, {label} (20 bf16 steps)",
                "accel_nb": mine,
                "reference": theirs,
                "ratio": mine / theirs if theirs else None,
                "unit": "s",
                "note": f"rank ran on {ours['result']['device']}; CUDA initialised in the kernel: "
                f"{ours['cuda_in_kernel']}; reference: accelerate runs one process in the kernel itself"
                + (
                    f" (CUDA in kernel: {ref.get('cuda_in_kernel')})"
                    if theirs
                    else f" ({ref.get('error', '')[:80]})"
                ),
            }
        )
    return rows


def write(doc: str, out_dir: str, pytest_rc: str) -> int:
    """Put the GPU figures into ``doc`` between the gpu-run markers (replacing an earlier GPU run)."""
    import torch

    from benchmarks.runner import table

    rows: list[dict] = []
    # bench.json: this run's benchmarks; bench-*.json: rows kept from an earlier run on the same machine
    # kind (a GPU lease is minutes: a later call may rerun only what failed); this run's rows win
    bench_rows: dict[tuple, dict] = {}
    for name in sorted(n for n in os.listdir(out_dir) if n.startswith("bench-") and n.endswith(".json")) + [
        "bench.json"
    ]:
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for row in json.load(f):
                    if name != "bench.json" and row.get("failed"):
                        continue
                    if name != "bench.json":
                        row = dict(row, note=f"{row['note']} [earlier call: {name[6:-5]}]")
                    bench_rows[(row["benchmark"], row["metric"])] = row
    rows += list(bench_rows.values())
    kernel = os.path.join(out_dir, "kernel.json")
    if os.path.exists(kernel):
        with open(kernel, encoding="utf-8") as f:
            rows += _kernel_rows(json.load(f))
    ds = os.path.join(out_dir, "deepspeed.json")
    if os.path.exists(ds):
        import gpu_check_deepspeed

        with open(ds, encoding="utf-8") as f:
            rows += gpu_check_deepspeed.rows(json.load(f))
    quant = os.path.join(out_dir, "quantization.json")
    if os.path.exists(quant):
        import gpu_check_quantization

        with open(quant, encoding="utf-8") as f:
            rows += gpu_check_quantization.rows(json.load(f))
    summary = ""
    pytest_txt = os.path.join(out_dir, "pytest.txt")
    if os.path.exists(pytest_txt):
        lines = [x for x in open(pytest_txt, encoding="utf-8").read().splitlines() if x.strip()]
        summary = lines[-1] if lines else ""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join(
        [
            BEGIN,
            "## GPU run",
            "",
            f"- **Date**: {now}",
            f"- **GPU**: {device} (x{torch.cuda.device_count()}), torch {torch.__version__}, CUDA {torch.version.cuda}",
            "- **Command**: `bash scripts/gpu_check.sh`",
            f"- **GPU-marked tests** (`pytest -m gpu`): {summary or 'no output'} (exit code {pytest_rc})",
            *([_refusal_line(out_dir)] if _refusal_line(out_dir) else []),
            "",
            table(rows, markdown=True)
            if rows
            else "No benchmark rows were produced; see the script's output.",
            "",
            END,
        ]
    )
    text = open(doc, encoding="utf-8").read() if os.path.exists(doc) else "# Benchmarks\n"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) :]
    elif "## What each benchmark measures" in text:
        at = text.index("## What each benchmark measures")
        text = text[:at] + section + "\n\n" + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(doc, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["kernel-launch"] and len(argv) == 2:
        return kernel_launch(argv[1])
    if argv[:1] == ["refusal"] and len(argv) == 2:
        return refusal(argv[1])
    if argv[:1] == ["write"] and len(argv) == 4:
        return write(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
