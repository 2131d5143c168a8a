"""Run a benchmark body on N hand-started gloo processes (no launcher in the way) and return rank 0's result.

    result = run_on_ranks(body, (steps, reps), world=2, what="the CPU training benchmark")

``body(rank, *args)`` runs in each process with the torchrun variables set (RANK, WORLD_SIZE,
MASTER_ADDR/PORT on loopback) and one intra-op thread; a failing rank's traceback is raised here.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    body: Callable[..., Any], rank: int, world: int, port: int, args: tuple, out: Any
) -> None:  # pragma: no cover - child
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    try:
        torch.set_num_threads(1)
        out.put((rank, True, body(rank, *args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(
    body: Callable[..., Any],
    args: tuple,
    world: int,
    what: str,
    start_method: str = "fork",
    timeout: float = 900,
) -> Any:
    """``body(rank, *args)`` on ``world`` processes; rank 0's return value (RuntimeError if a rank failed)."""
    ctx = mp.get_context(start_method)
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(body, r, world, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, ok, value = out.get(timeout=timeout)
            if not ok:
                raise RuntimeError(f"{what}: rank {rank} failed: {value}")
            got[rank] = value
    except queue_mod.Empty:
        raise RuntimeError(f"{what} did not finish within {timeout:.0f} s") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got[0]
