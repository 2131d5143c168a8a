"""Run a test function on N real processes forming a gloo group (independent of accel_nb.launch).

    results = run_ranks(my_fn, world_size=2)      # my_fn() runs on every rank; results in rank order

The function runs in forked children with the torchrun environment set; exceptions come back
with the child's traceback. Used by the core tests so they do not depend on the launcher (only
its free-port picker, the one home of that rule).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

from accel_nb.launch.ports import pick_free_port as free_port  # the launcher's picker; tests import it here


def _child(fn, rank, world_size, port, env, args, queue):  # pragma: no cover - runs in the child
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    os.environ.update(env or {})
    try:
        import torch

        torch.set_num_threads(1)
        from accel_nb.state import _reset_all_states

        _reset_all_states()
        value = fn(*args)
        # plain pickle: tensors travel by value, not as shared-memory handles that vanish when
        # this rank exits
        queue.put((rank, True, pickle.dumps(value)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            with contextlib.suppress(RuntimeError):  # teardown of a group a failed peer broke
                dist.destroy_process_group()


class RanksFailed(AssertionError):
    pass


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    args: tuple = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` forked ranks; return the per-rank results."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(fn, r, world_size, port, env, args, queue))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        import queue as _q

        for _ in range(world_size):
            try:
                rank, ok, value = queue.get(timeout=timeout)
            except _q.Empty:
                raise RanksFailed(f"ranks did not finish within {timeout} s; got {sorted(results)}") from None
            if ok:
                results[rank] = pickle.loads(value)
            else:
                errors[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RanksFailed("\n".join(f"--- rank {r} ---\n{e}" for r, e in sorted(errors.items())))
    return [results[r] for r in range(world_size)]
