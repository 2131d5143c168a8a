"""Run the benchmark modules, print one table of accel_nb vs the reference, write a results page.

Each ``benchmarks/bench_<name>.py`` exposes ``run(quick: bool = False) -> list[dict]`` returning
rows ``{"benchmark", "metric", "accel_nb", "reference", "ratio", "unit", "note"}``. The runner
runs every module in its own subprocess (one failure or crash never stops the others; it becomes
a FAILED row), repeats it ``--repeat`` times, and reports the min and median of each value.

    python -m benchmarks run                       # everything
    python -m benchmarks run import launch --quick # two modules, short settings
    python -m benchmarks run --markdown docs/benchmarks.md
    python -m benchmarks run deepspeed --markdown docs/benchmarks.md   # only deepspeed's rows change
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ROW_KEYS = ("benchmark", "metric", "accel_nb", "reference", "ratio", "unit", "note")
_BEGIN, _END = "@@accel_nb-bench-rows@@", "@@end-rows@@"
DEFAULT_TIMEOUT_S = 600.0
# sections of the results page written by others, kept when the runner rewrites it:
# scripts/gpu_check.sh's GPU run, and the soak's (python -m benchmarks.bench_soak --markdown PATH)
KEPT_SECTIONS = (
    ("<!-- gpu-run:begin -->", "<!-- gpu-run:end -->"),
    ("<!-- soak:begin -->", "<!-- soak:end -->"),
)


# ----------------------------------------------------------------------------- discovery
def discover(directory: str = HERE) -> list[str]:
    """Names of the benchmark modules: ``bench_launch.py`` -> ``"launch"``, sorted."""
    return sorted(
        f[len("bench_") : -3] for f in os.listdir(directory) if f.startswith("bench_") and f.endswith(".py")
    )


def module_summary(name: str) -> str:
    """First paragraph of a benchmark module's docstring, on one line, read without importing it."""
    import ast

    path = os.path.join(HERE, f"bench_{name}.py")
    try:
        doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read())) or ""
    except (OSError, SyntaxError):
        return ""
    first_paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in first_paragraph.splitlines())


# ----------------------------------------------------------------------------- rows
def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def normalize_row(row: Any, module: str) -> dict[str, Any]:
    """A row with every key, numbers as floats, the ratio filled in when both sides are known."""
    if not isinstance(row, dict):
        return failure_row(module, f"run() returned a {type(row).__name__} instead of a dict row")
    out = {k: row.get(k) for k in ROW_KEYS}
    out["benchmark"] = str(out["benchmark"] or module)
    out["metric"] = str(out["metric"] or "?")
    out["unit"] = str(out["unit"] or "")
    out["note"] = str(out["note"] or "")
    for key in ("accel_nb", "reference", "ratio"):
        out[key] = _number(out[key])
    if out["ratio"] is None and out["accel_nb"] is not None and out["reference"]:
        out["ratio"] = out["accel_nb"] / out["reference"]
    return out


def failure_row(module: str, message: str) -> dict[str, Any]:
    return {
        "benchmark": module,
        "metric": "FAILED",
        "accel_nb": None,
        "reference": None,
        "ratio": None,
        "unit": "",
        "note": message,
        "failed": True,
    }


# ----------------------------------------------------------------------------- child side
def child_main(name: str, quick: bool, package: str = "benchmarks") -> int:
    """Run one module's ``run()`` in this process and print its rows as JSON between markers."""
    sys.path.insert(0, ROOT)
    try:
        module = importlib.import_module(f"{package}.bench_{name}")
        rows = module.run(quick=quick)
        payload = json.dumps(list(rows), default=str)
    except BaseException:  # noqa: BLE001 - report anything, the parent decides
        traceback.print_exc()
        return 1
    sys.stdout.write(f"\n{_BEGIN}\n{payload}\n{_END}\n")
    sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------- parent side
def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def run_module(
    name: str, quick: bool = False, timeout: float = DEFAULT_TIMEOUT_S, package: str = "benchmarks"
) -> tuple[list[dict], float]:
    """Run ``<package>.bench_<name>`` in a fresh interpreter; return its normalised rows and the wall time."""
    cmd = [sys.executable, "-m", "benchmarks.runner", "--child", name, "--package", package]
    cmd += ["--quick"] if quick else []
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    start = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return [
            failure_row(name, f"timed out after {timeout:.0f} s; last output: {_last_lines(out)}")
        ], timeout
    wall = time.perf_counter() - start
    if res.returncode != 0 or _BEGIN not in res.stdout:
        why = _last_lines(res.stderr) or _last_lines(res.stdout) or f"exit code {res.returncode}"
        return [failure_row(name, f"exit code {res.returncode}: {why}")], wall
    payload = res.stdout.split(_BEGIN, 1)[1].split(_END, 1)[0]
    try:
        rows = json.loads(payload)
    except json.JSONDecodeError as exc:
        return [failure_row(name, f"unreadable rows: {exc}")], wall
    if not rows:
        return [failure_row(name, "run() returned no rows")], wall
    return [normalize_row(r, name) for r in rows], wall


def aggregate(repeats: Sequence[Sequence[dict]]) -> list[dict]:
    """Merge the rows of several repetitions of one module: min and median of every value."""
    merged: dict[tuple[str, str], list[dict]] = {}
    for rows in repeats:
        for row in rows:
            merged.setdefault((row["benchmark"], row["metric"]), []).append(row)
    out = []
    for runs in merged.values():
        first = dict(runs[-1])
        first["repeats"] = len(runs)
        for key in ("accel_nb", "reference", "ratio"):
            values = [r[key] for r in runs if r[key] is not None]
            first[key] = statistics.median(values) if values else None
            first[key + "_min"] = min(values) if values else None
        if len(runs) > 1 and first.get("failed"):
            first["note"] = "; ".join(dict.fromkeys(r["note"] for r in runs))
        out.append(first)
    return out


def run_all(
    names: Sequence[str],
    quick: bool = False,
    repeat: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
    echo: bool = True,
    package: str = "benchmarks",
) -> tuple[list[dict], dict[str, float]]:
    """Run every named module ``repeat`` times; return the aggregated rows and each module's wall time."""
    rows: list[dict] = []
    walls: dict[str, float] = {}
    for name in names:
        repeats, total = [], 0.0
        for i in range(repeat):
            if echo:
                print(f"[bench] {name} ({i + 1}/{repeat}) ...", file=sys.stderr, flush=True)
            module_rows, wall = run_module(name, quick=quick, timeout=timeout, package=package)
            repeats.append(module_rows)
            total += wall
            if echo:
                failed = [r for r in module_rows if r.get("failed")]
                state = f"FAILED: {failed[0]['note']}" if failed else f"{len(module_rows)} rows"
                print(f"[bench] {name}: {state} in {wall:.1f} s", file=sys.stderr, flush=True)
        walls[name] = total
        rows.extend(aggregate(repeats))
    return rows, walls


# ----------------------------------------------------------------------------- formatting
def fmt(value: float | None, digits: int = 4) -> str:
    """Four significant digits; ``-`` for unknown."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 10**digits or abs(value) < 10**-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def _cell(row: dict, key: str) -> str:
    med, low = row.get(key), row.get(key + "_min")
    if row.get("repeats", 1) > 1 and med is not None and low is not None and low != med:
        return f"{fmt(med)} (min {fmt(low)})"
    return fmt(med)


def table(rows: Sequence[dict], markdown: bool = False) -> str:
    """The rows as a plain-text table (or a Markdown one)."""
    header = ["benchmark", "metric", "accel_nb", "reference", "ratio", "unit", "note"]
    body = [
        [
            r["benchmark"],
            r["metric"],
            _cell(r, "accel_nb"),
            _cell(r, "reference"),
            _cell(r, "ratio"),
            r["unit"],
            r["note"],
        ]
        for r in rows
    ]
    if markdown:

        def esc(s: str) -> str:
            return str(s).replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] * len(header)) + "|"]
        lines += ["| " + " | ".join(esc(c) for c in line) + " |" for line in body]
        return "\n".join(lines)
    note_width = 100  # the terminal table shortens long notes; the Markdown page keeps them whole
    body = [
        line[:-1] + [line[-1] if len(line[-1]) <= note_width else line[-1][: note_width - 1] + "…"]
        for line in body
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    sep = "  "
    lines = [sep.join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append(sep.join("-" * w for w in widths))
    lines += [sep.join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the machine
def machine_info() -> dict[str, str]:
    """What this machine is, without creating a CUDA context (nvidia-smi, /proc, psutil)."""
    info: dict[str, str] = {}
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["CPU"] = f"{cpu}, {os.cpu_count()} logical cores"
    try:
        import psutil

        info["CPU"] += f" ({psutil.cpu_count(logical=False)} physical)"
        info["RAM"] = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except Exception:  # noqa: BLE001 - psutil is a dependency, but the page should still be written
        pass
    gpu = "none"
    if shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            lines = [ln.strip() for ln in q.stdout.splitlines() if ln.strip()]
            if q.returncode == 0 and lines:
                gpu = "; ".join(lines)
        except (OSError, subprocess.TimeoutExpired):
            pass
    info["GPU"] = gpu
    info["OS"] = f"{platform.system()} {platform.release()}"
    versions = [f"Python {platform.python_version()}"]
    for dist in ("torch", "accel_nb", "accelerate"):
        try:
            from importlib.metadata import version

            versions.append(f"{dist} {version(dist)}")
        except Exception:  # noqa: BLE001 - not installed
            versions.append(f"{dist} (not installed)")
    info["Software"] = ", ".join(versions)
    return info


def command_line(argv: Sequence[str]) -> str:
    return "python -m benchmarks " + " ".join(shlex.quote(a) for a in argv)


def markdown_page(
    rows: Sequence[dict], argv: Sequence[str], names: Sequence[str], walls: dict[str, float]
) -> str:
    """docs/benchmarks.md: the table with the date, the machine and the exact command."""
    info = machine_info()
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Benchmarks",
        "",
        "accel_nb side by side with the reference library (Hugging Face accelerate) in the same run,",
        "on the same machine. Machines are noisy: read the **ratios** (accel_nb / reference, or",
        "accel_nb / a plain-PyTorch baseline, as the note says), not the absolute figures. Values are",
        "medians over the repetitions each benchmark makes (min in parentheses where the runner",
        "repeated a module).",
        "",
        "This page is written by the runner; regenerate it with the command below. A run of some",
        "modules (`python -m benchmarks run NAME ... --markdown docs/benchmarks.md`) replaces only",
        "those modules' rows and says so in a **Re-run** line; the rest of the page stays.",
        "",
        "## Latest run",
        "",
        f"- **Date**: {now}",
    ]
    out += [f"- **{k}**: {v}" for k, v in info.items()]
    out += [
        f"- **Command**: `{command_line(argv)}`",
        f"- **Wall time**: {sum(walls.values()):.0f} s ("
        + ", ".join(f"{n} {w:.0f} s" for n, w in walls.items())
        + ")",
        "",
        table(rows, markdown=True),
        "",
    ]
    if info.get("GPU", "none") == "none":
        out += [
            "```{note}",
            "This machine has no GPU: the GPU benchmarks (training-step overhead of a GPT-2-small-sized",
            "model in bf16, sharded safetensors loading straight to the GPU, offloaded forward throughput",
            "against pinned host-to-device bandwidth) are pending a run on a GPU machine",
            '(`bash scripts/gpu_check.sh` there adds them as a "GPU run" section).',
            "```",
            "",
        ]
    out += ["## What each benchmark measures", ""]
    for name in names:
        out.append(f"- `bench_{name}.py` — {module_summary(name) or '(no description)'}")
    out += [
        "",
        "Run one module alone with `python -m benchmarks.bench_<name>`, or a subset with",
        "`python -m benchmarks run <name> ...`; `--quick` uses smaller settings.",
        "",
    ]
    return "\n".join(out)


_LATEST = "## Latest run"
_TABLE_HEADER = "| benchmark | metric |"


def _table_span(page: str) -> tuple[int, int] | None:
    """The (first, last + 1) line numbers of the "Latest run" table of a results page; None if it has none."""
    lines = page.splitlines()
    if _LATEST not in lines:
        return None
    start = lines.index(_LATEST)
    for i in range(start, len(lines)):
        if lines[i].startswith("## ") and i > start:
            return None
        if lines[i].startswith(_TABLE_HEADER):
            end = i + 2  # the header and its --- line
            while end < len(lines) and lines[end].startswith("| "):
                end += 1
            return i, end
    return None


def _belongs_to(benchmark: str, names: Sequence[str]) -> bool:
    """Whether a row's benchmark column comes from one of the modules ``names`` (``deepspeed`` writes
    ``deepspeed_cpu_2proc``; a failed module writes its own name)."""
    return any(benchmark == n or benchmark.startswith(n + "_") for n in names)


def updated_page(
    old: str, rows: Sequence[dict], argv: Sequence[str], names: Sequence[str], walls: dict[str, float]
) -> str:
    """``old`` (a results page) with the rows of the modules ``names`` replaced by ``rows``: the other
    modules' rows, the machine and command of the full run and every other section stay as they were;
    a "Re-run" line under the full run's says when, where and with which command these rows were made
    (one line per set of modules: a later re-run of the same modules replaces it)."""
    lines = old.splitlines()
    first, end = _table_span(old)  # type: ignore[misc] # the caller checked there is a table
    new_rows = table(rows, markdown=True).splitlines()[2:]
    body, placed = [], False
    for line in lines[first + 2 : end]:
        benchmark = line[2:].split(" | ", 1)[0].strip()
        if _belongs_to(benchmark, names):
            if not placed:
                body += new_rows
                placed = True
            continue
        body.append(line)
    if not placed:
        body += new_rows
    info = machine_info()
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = "; ".join(
        f"{k} {v}" for k, v in info.items() if f"- **{k}**: {v}" not in lines[:first] and k != "Software"
    )
    tag = "- **Re-run** of " + ", ".join(names) + ":"
    rerun = (
        f"{tag} {now}, `{command_line(argv)}`, "
        + ", ".join(f"{n} {w:.0f} s" for n, w in walls.items())
        + (f" (machine: {machine}" if machine else " (same machine")
        + (f"; load average {os.getloadavg()[0]:.1f} at the end)" if hasattr(os, "getloadavg") else ")")
        + "; these modules' rows below come from it"
    )
    head = [ln for ln in lines[:first] if not ln.startswith(tag)]
    at = max((i for i, ln in enumerate(head) if ln.startswith("- **")), default=len(head) - 1) + 1
    head.insert(at, rerun)
    page = head + lines[first : first + 2] + body + lines[end:]
    return "\n".join(page) + ("\n" if old.endswith("\n") else "")


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks", description="accel_nb benchmarks vs the reference"
    )
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run benchmark modules and print the table")
    run.add_argument("names", nargs="*", metavar="NAME", help="modules to run (bench_NAME.py); default: all")
    run.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    run.add_argument("--repeat", type=int, default=1, metavar="K", help="run each module K times (default 1)")
    run.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per module run")
    run.add_argument(
        "--markdown", metavar="PATH", help="also write the results page (e.g. docs/benchmarks.md)"
    )
    run.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    sub.add_parser("list", help="list the benchmark modules")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        package = argv[argv.index("--package") + 1] if "--package" in argv else "benchmarks"
        return child_main(argv[1], quick="--quick" in argv[2:], package=package)
    args = build_parser().parse_args(argv)
    available = discover()
    if args.command == "list":
        for name in available:
            print(f"{name:16s} {module_summary(name)}")
        return 0
    unknown = [n for n in args.names if n not in available]
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available)}", file=sys.stderr
        )
        return 2
    if args.repeat < 1:
        print("--repeat must be >= 1", file=sys.stderr)
        return 2
    names = args.names or available
    rows, walls = run_all(names, quick=args.quick, repeat=args.repeat, timeout=args.timeout)
    print(table(rows))
    failed = sorted({r["benchmark"] for r in rows if r.get("failed")})
    print(
        f"\n{len(rows)} rows from {len(names)} module(s) in {sum(walls.values()):.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    if args.markdown:
        old = open(args.markdown, encoding="utf-8").read() if os.path.exists(args.markdown) else ""
        partial = set(names) != set(available) and _table_span(old) is not None
        page = (
            updated_page(old, rows, argv, names, walls)
            if partial
            else markdown_page(rows, argv, names, walls)
        )
        for begin, end in KEPT_SECTIONS if not partial else ():
            if begin in old and end in old:
                kept = old[old.index(begin) : old.index(end) + len(end)]
                at = page.index("## What each benchmark measures")
                page = page[:at] + kept + "\n\n" + page[at:]
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(page)
        print(f"wrote {args.markdown}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
