"""Soak of a long interactive session in a REAL Jupyter kernel: ``%accelerate start -n 2 --cpu``, then 500
cells (DDP training steps, collectives, prints, tqdm bars, push/pull, 50 interrupts of which 10 inside an
``all_reduce``, 20 failing cells); open fds, threads and child processes of the kernel and of each worker,
and the kernel's RSS, sampled every 50 cells; every interrupt's return latency.

Pass/fail: fds, threads and children flat after the first 50 cells; kernel RSS growth bounded (MiB);
every interrupt returned within 2 s. ``--quick`` runs 100 cells (10 interrupts, 2 in a collective, 4
failing). An interrupt is sent only once every rank printed the cell's marker (the cell is running).

python -m benchmarks run soak [--quick]          # through the runner: one row per check and per sample
python -m benchmarks.bench_soak [--quick] [--markdown docs/benchmarks.md]   # the table; its section of the page
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SAMPLE_EVERY = 50
INTERRUPT_LIMIT_S = 2.0
RSS_LIMIT_MIB = 64.0  # kernel RSS growth allowed from the sample at cell 50 to the last one
COUNTERS = ("fds", "threads", "children")

SETUP = (
    "%%accelerate\n"
    "import time, torch, torch.distributed as dist\n"
    "from accel_nb import Accelerator\n"
    "torch.manual_seed(0)\n"
    "accelerator = Accelerator()\n"
    "model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "model, opt = accelerator.prepare(model, opt)\n"
    "rank = dist.get_rank()\n"
    "steps = 0\n"
    "rank\n"
)

CELLS = {
    "train": (
        "%%accelerate\n"
        "x = torch.randn(16, 8)\n"
        "loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))\n"
        "accelerator.backward(loss); opt.step(); opt.zero_grad()\n"
        "steps += 1\n"
        "t = torch.tensor([loss.item()]); dist.all_reduce(t)\n"
    ),
    "collective": "%%accelerate\nt = torch.ones(1); dist.all_reduce(t); dist.barrier(); t.item()\n",
    "print": "%%accelerate\nfor j in range(5):\n    print(f'rank {rank} line {j}')\n",
    "tqdm": "%%accelerate\nfrom tqdm.auto import tqdm\nfor _ in tqdm(range(30), desc='soak'):\n    pass\n",
    "push": "soak_value = {'cell': __CELL__, 'data': list(range(256))}\n%accelerate push soak_value\n",
    "pull": "%accelerate pull steps --rank __RANK__\nassert isinstance(steps, int), steps\n",
    # failing cells: every rank raises; rank 1 alone raises; rank 0 raises while rank 1 waits in all_reduce
    "fail_all": "%%accelerate\nraise ValueError(f'soak failure on rank {rank}')\n",
    "fail_one": "%%accelerate\nif rank == 1:\n    raise RuntimeError('soak failure on rank 1')\n",
    "fail_collective": (
        "%%accelerate\nif rank == 0:\n    raise RuntimeError('rank 0 gave up')\ndist.all_reduce(torch.ones(1))\n"
    ),
    # interrupts: each rank prints its marker, then waits (in Python, or rank 0 in all_reduce)
    "interrupt": (
        "%%accelerate\nprint(f'SOAK-RUNNING-{rank}', flush=True)\nwhile True:\n    time.sleep(0.01)\n"
    ),
    "interrupt_collective": (
        "%%accelerate\nprint(f'SOAK-RUNNING-{rank}', flush=True)\nif rank == 0:\n"
        "    dist.all_reduce(torch.ones(1))\nwhile True:\n    time.sleep(0.01)\n"
    ),
}
ORDINARY = ("train", "train", "collective", "print", "tqdm", "train", "push", "pull")


# ----------------------------------------------------------------------------- sampling helpers
def process_sample(pid: int, skip_under: str | None = None) -> dict[str, float]:
    """Open fds, threads, live descendants and RSS (MiB) of one process (psutil).

    Fds whose target lies under ``skip_under`` are not counted: the kernel's IPython history writer
    opens its database's journal (and folder) for a moment after each cell, which is not a leak.
    """
    import psutil

    proc = psutil.Process(pid)
    with proc.oneshot():
        children = [c for c in proc.children(recursive=True) if _alive(c)]
        return {
            "fds": _count_fds(proc, skip_under),
            "threads": proc.num_threads(),
            "children": len(children),
            "rss_mib": proc.memory_info().rss / 2**20,
        }


def _count_fds(proc: Any, skip_under: str | None) -> int:
    base = f"/proc/{proc.pid}/fd"
    if not skip_under or not os.path.isdir(base):
        return proc.num_fds()
    count = 0
    for fd in os.listdir(base):
        try:
            target = os.readlink(os.path.join(base, fd))
        except OSError:  # closed meanwhile
            continue
        count += not target.startswith(skip_under)
    return count


def _alive(proc: Any) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def take_sample(cells: int, kernel_pid: int, rank_pids: dict[int, int]) -> dict[str, Any]:
    """One row of the soak table: the kernel's and each worker's counters after ``cells`` cells."""
    sample: dict[str, Any] = {"cells": cells, "kernel": process_sample(kernel_pid, _ipython_dir())}
    for rank, pid in sorted(rank_pids.items()):
        sample[f"rank {rank}"] = process_sample(pid)
    return sample


def _ipython_dir() -> str | None:
    try:
        from IPython.paths import get_ipython_dir
    except ImportError:
        return None
    return os.path.realpath(get_ipython_dir()) + os.sep


def processes(samples: list[dict[str, Any]]) -> list[str]:
    """The processes a list of samples describes: ``kernel``, ``rank 0``, ..."""
    return [k for k in samples[0] if k != "cells"] if samples else []


def growth_after(samples: list[dict[str, Any]], first_cells: int) -> dict[str, dict[str, float]]:
    """For each process and counter, how far it rose above its value at ``first_cells`` (max over the later samples)."""
    base = next((s for s in samples if s["cells"] >= first_cells), None)
    later = [s for s in samples if base is not None and s["cells"] > base["cells"]]
    out: dict[str, dict[str, float]] = {}
    for who in processes(samples):
        out[who] = {}
        for key in (*COUNTERS, "rss_mib"):
            if base is None or not later:
                out[who][key] = 0
            else:
                out[who][key] = max(s[who][key] for s in later) - base[who][key]
    return out


def sample_table(samples: list[dict[str, Any]]) -> str:
    """The samples as a Markdown table: cells, then fds / threads / children of each process, then RSS of each."""
    who = processes(samples)
    header = ["cells"] + [f"{key} ({w})" for key in COUNTERS for w in who]
    header += ["kernel RSS (MiB)"] + [f"RSS {w} (MiB)" for w in who if w != "kernel"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" ---: " for _ in header) + "|"]
    for s in samples:
        cols = [str(s["cells"])] + [str(int(s[w][key])) for key in COUNTERS for w in who]
        cols += [f"{s[w]['rss_mib']:.1f}" for w in ["kernel"] + [w for w in who if w != "kernel"]]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def schedule(n_cells: int, n_interrupts: int, n_collective: int, n_failing: int) -> list[str]:
    """The kind of each cell: interrupts and failures spread evenly over the run, ordinary cells between."""
    kinds = [ORDINARY[i % len(ORDINARY)] for i in range(n_cells)]
    special = ["interrupt_collective"] * n_collective + ["interrupt"] * (n_interrupts - n_collective)
    fails = ("fail_all", "fail_one", "fail_collective", "fail_all")
    special += [fails[i % len(fails)] for i in range(n_failing)]
    ordered = _interleave(
        [k for k in special if k == "interrupt_collective"],
        [k for k in special if k == "interrupt"],
        [k for k in special if k.startswith("fail")],
    )
    step = n_cells / (len(ordered) + 1)
    for i, kind in enumerate(ordered):
        kinds[int((i + 1) * step)] = kind
    return kinds


def _interleave(*groups: list[str]) -> list[str]:
    total = sum(len(g) for g in groups)
    slots: list[tuple[float, str]] = []
    for g in groups:
        slots += [((i + 0.5) / len(g), kind) for i, kind in enumerate(g)]
    return [kind for _, kind in sorted(slots, key=lambda s: s[0])][:total]


# ----------------------------------------------------------------------------- the run
def _session_pids(k: Any) -> dict[int, int]:
    out = k.run(
        "from accel_nb.notebook.session_magics import active_session as _soak_active\n"
        "print(*(f'{p.rank}:{p.pid}' for p in _soak_active().procs))",
        timeout=60,
    )
    if out.error is not None:
        raise RuntimeError(out.traceback)
    return {int(r): int(p) for r, p in (pair.split(":") for pair in out.stdout.split())}


def _run_cell(
    k: Any, code: str, markers: Iterable[str] = (), timeout: float = 300
) -> tuple[Any, float | None]:
    """Run one cell; with ``markers``, interrupt it once all were printed; return its output and the latency."""
    wanted = list(markers)
    seen = ""
    sent_at: list[float] = []

    def on_message(msg: dict[str, Any]) -> None:
        nonlocal seen
        if not wanted or sent_at or msg["msg_type"] != "stream":
            return
        seen += msg["content"]["text"]
        if all(m in seen for m in wanted):
            sent_at.append(time.monotonic())
            k.km.interrupt_kernel()

    msg_id = k.kc.execute(code)
    out = k.collect(msg_id, timeout=timeout, on_message=on_message)
    latency = time.monotonic() - sent_at[0] if sent_at else None
    if out.timed_out:
        raise RuntimeError(f"a cell did not end within {timeout:.0f} s: {code!r}\n{out.text[-2000:]}")
    return out, latency


def soak(
    n_cells: int = 500, n_interrupts: int = 50, n_collective: int = 10, n_failing: int = 20
) -> dict[str, Any]:
    """Run the soak; return the samples, the interrupt latencies and the counts of each outcome."""
    from tests.kernel_helpers import KernelSession

    kinds = schedule(n_cells, n_interrupts, n_collective, n_failing)
    samples: list[dict[str, Any]] = []
    latencies: dict[str, list[float]] = {"interrupt": [], "interrupt_collective": []}
    freed_in_collective = 0
    unexpected: list[str] = []
    pid_changes = 0
    started = time.monotonic()
    with KernelSession(env={"ACCEL_NB_PROGRESS": "text"}) as k:
        for code in ("%load_ext accel_nb", "%accelerate start -n 2 --cpu", SETUP):
            out = k.run(code, timeout=300)
            if out.error is not None:
                raise RuntimeError(out.traceback)
        rank_pids = _session_pids(k)
        samples.append(take_sample(0, k.pid, rank_pids))
        for i, kind in enumerate(kinds, start=1):
            code = CELLS[kind].replace("__CELL__", str(i)).replace("__RANK__", str(i % 2))
            markers = [f"SOAK-RUNNING-{r}" for r in rank_pids] if kind.startswith("interrupt") else []
            out, latency = _run_cell(k, code, markers)
            if kind.startswith("interrupt"):
                latencies[kind].append(latency)
                ename = out.error["ename"] if out.error else None
                if ename != "KeyboardInterrupt":
                    unexpected.append(f"cell {i} ({kind}): {ename or 'no error'}: {out.text[-300:]}")
                if "freed by closing the process group" in (out.error or {}).get("evalue", ""):
                    freed_in_collective += 1
            elif kind.startswith("fail"):
                if out.error is None or out.error["ename"] != "LaunchError":
                    unexpected.append(f"cell {i} ({kind}): {out.error and out.error['ename']}")
            elif out.error is not None:
                unexpected.append(f"cell {i} ({kind}): {out.traceback[-600:]}")
            if i % SAMPLE_EVERY == 0 or i == n_cells:
                now_pids = _session_pids(k)
                if now_pids != rank_pids:
                    pid_changes += 1
                    rank_pids = now_pids
                samples.append(take_sample(i, k.pid, rank_pids))
        k.run("%accelerate stop", timeout=120)
    return {
        "kinds": kinds,
        "samples": samples,
        "latencies": latencies,
        "freed_in_collective": freed_in_collective,
        "unexpected": unexpected,
        "pid_changes": pid_changes,
        "wall_s": time.monotonic() - started,
    }


def report(result: dict[str, Any]) -> tuple[list[dict], str]:
    """The runner's rows and a Markdown report (the sample table and each check's pass/fail)."""
    samples, kinds = result["samples"], result["kinds"]
    grew = growth_after(samples, SAMPLE_EVERY)
    all_lat = [x for v in result["latencies"].values() for x in v if x is not None]
    coll_lat = [x for x in result["latencies"]["interrupt_collective"] if x is not None]
    base = next(s for s in samples if s["cells"] >= SAMPLE_EVERY)
    rss_growth = samples[-1]["kernel"]["rss_mib"] - base["kernel"]["rss_mib"]
    what = (
        f"{len(kinds)} cells ({kinds.count('train')} training steps, {kinds.count('collective')} collectives, "
        f"{kinds.count('print')} prints, {kinds.count('tqdm')} tqdm bars, {kinds.count('push')} pushes, "
        f"{kinds.count('pull')} pulls, {sum(k.startswith('interrupt') for k in kinds)} interrupts of which "
        f"{kinds.count('interrupt_collective')} in all_reduce, {sum(k.startswith('fail') for k in kinds)} failing), "
        f"2 CPU workers (gloo), {result['wall_s']:.0f} s"
    )
    rows, checks = [], []
    for key in COUNTERS:
        worst = max(grew[w][key] for w in grew)
        per = ", ".join(f"{w} {int(grew[w][key]):+d}" for w in grew)
        ok = worst <= 0
        checks.append((f"{key} flat after cell {SAMPLE_EVERY}", ok, per))
        rows.append(_row(f"{key}: largest rise after cell {SAMPLE_EVERY}", worst, "count", ok, per, what))
    ok = rss_growth <= RSS_LIMIT_MIB
    workers = ", ".join(
        f"{w} {samples[-1][w]['rss_mib'] - base[w]['rss_mib']:+.1f} MiB"
        for w in processes(samples)
        if w != "kernel"
    )
    per = (
        f"cell {base['cells']}: {base['kernel']['rss_mib']:.1f} MiB, cell {samples[-1]['cells']}: "
        f"{samples[-1]['kernel']['rss_mib']:.1f} MiB; limit {RSS_LIMIT_MIB:.0f} MiB; the workers: {workers}"
    )
    checks.append((f"kernel RSS growth after cell {SAMPLE_EVERY}: {rss_growth:+.1f} MiB", ok, per))
    rows.append(_row(f"kernel RSS growth after cell {SAMPLE_EVERY}", rss_growth, "MiB", ok, per, what))
    n_int = sum(k.startswith("interrupt") for k in kinds)
    ok = len(all_lat) == n_int and all(x <= INTERRUPT_LIMIT_S for x in all_lat)
    stat = (
        f"max {max(all_lat):.2f} s, median {statistics.median(all_lat):.2f} s over {len(all_lat)}"
        if all_lat
        else "none measured"
    )
    coll = (
        f"in all_reduce: max {max(coll_lat):.2f} s, median {statistics.median(coll_lat):.2f} s; "
        f"{result['freed_in_collective']} were freed by closing the group"
        if coll_lat
        else ""
    )
    checks.append((f"every interrupt returned within {INTERRUPT_LIMIT_S:.0f} s: {stat}", ok, coll))
    rows.append(_row("interrupt return latency (max)", max(all_lat or [0]), "s", ok, f"{stat}; {coll}", what))
    rows.append(
        _row("interrupt return latency (median)", statistics.median(all_lat or [0]), "s", ok, stat, what)
    )
    ok = not result["unexpected"] and result["pid_changes"] == 0
    per = (
        "; ".join(result["unexpected"][:3])
        or "every cell ended as its kind should; the same 2 workers throughout"
    )
    checks.append(("every cell ended as expected, no worker restarted", ok, per))
    rows.append(_row("cells that ended unexpectedly", len(result["unexpected"]), "count", ok, per, what))
    for s in samples:
        counts = "; ".join(
            f"{key} " + "/".join(str(int(s[w][key])) for w in processes(samples)) for key in COUNTERS
        )
        rows.append(
            _row(
                f"sample after {s['cells']} cells: kernel RSS",
                s["kernel"]["rss_mib"],
                "MiB",
                True,
                f"{counts} ({'/'.join(processes(samples))})",
                "",
            )
        )
        rows[-1]["note"] = rows[-1]["note"][len("PASS: ") :].rstrip("; ")
    md = [sample_table(samples), ""]
    md += [
        f"- {'PASS' if ok else 'FAIL'}: {name}" + (f" ({detail})" if detail else "")
        for name, ok, detail in checks
    ]
    md += ["", f"({what})"]
    return rows, "\n".join(md)


def _row(metric: str, value: float, unit: str, ok: bool, detail: str, what: str) -> dict[str, Any]:
    return {
        "benchmark": "soak",
        "metric": metric,
        "accel_nb": value,
        "reference": None,
        "ratio": None,
        "unit": unit,
        "note": f"{'PASS' if ok else 'FAIL'}: {detail}; {what}",
    }


def run(quick: bool = False) -> list[dict]:
    result = soak(100, 10, 2, 4) if quick else soak()
    rows, md = report(result)
    print(md, file=sys.stderr, flush=True)
    return rows


SECTION_BEGIN, SECTION_END = "<!-- soak:begin -->", "<!-- soak:end -->"


def markdown_section(md: str, command: str, load: tuple[float, float]) -> str:
    """The soak's section of docs/benchmarks.md (kept by the runner when it rewrites the page)."""
    import datetime as _dt
    import platform

    from benchmarks.runner import machine_info

    info = machine_info()
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            SECTION_BEGIN,
            "## Soak: a long session",
            "",
            "A real Jupyter kernel, `%accelerate start -n 2 --cpu`, then cells of every kind; the kernel's",
            "and each worker's open fds, threads, child processes and RSS after every 50",
            "cells (fds of IPython's own history database, opened for a moment after each cell, are not",
            "counted); each interrupt's time from the kernel's interrupt to the cell's end.",
            "",
            "The first runs found one defect: an interrupt of a cell in which a rank waited in `all_reduce`",
            "took 2.7-2.8 s to return (the 2 s a rank gets to answer SIGINT, then the other rank's",
            "connect retries to the new group's store and a Python loop over every object for DDP",
            "models). Now a rank whose stack shows it in a collective is freed 0.2 s after SIGINT, the",
            "other ranks wait for the new store to listen, and the DDP models are found in C.",
            "RSS keeps a slow climb of a few KiB per cell in each process, half of it each cell's source,",
            "kept (in `linecache`) so that tracebacks show the lines of functions defined in earlier cells;",
            "IPython keeps the notebook's cells in the kernel the same way.",
            "",
            f"- **Date**: {now}",
            f"- **Machine**: {info.get('CPU', platform.machine())}, {info.get('RAM', '?')} RAM; "
            f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (the machine was shared)",
            f"- **Command**: `{command}`",
            "",
            md,
            SECTION_END,
        ]
    )


def write_section(path: str, section: str) -> None:
    """Put ``section`` in the page at ``path``: in place of the last one, else before "What each benchmark measures"."""
    page = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    if SECTION_BEGIN in page and SECTION_END in page:
        page = (
            page[: page.index(SECTION_BEGIN)] + section + page[page.index(SECTION_END) + len(SECTION_END) :]
        )
    elif "## What each benchmark measures" in page:
        at = page.index("## What each benchmark measures")
        page = page[:at] + section + "\n\n" + page[at:]
    else:
        page = page.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    load_start = os.getloadavg()[0]
    result = soak(100, 10, 2, 4) if quick else soak()
    rows, md = report(result)
    print(md)
    if "--markdown" in argv:
        path = argv[argv.index("--markdown") + 1]
        command = "python -m benchmarks.bench_soak" + (" --quick" if quick else "") + f" --markdown {path}"
        write_section(path, markdown_section(md, command, (load_start, os.getloadavg()[0])))
        print(f"wrote the soak section of {path}")
    return 0 if all(r["note"].startswith("PASS") or "sample after" in r["metric"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
