"""accel_nb's collectives on XLA devices: all-gather, all-reduce, broadcast and objects, with torch_xla.

``accel_nb.ops`` keeps the public functions (structure walking, shape checks, padding) and calls
these for the communication itself when the run is on XLA devices. Each one flushes the
device's pending graph first, then runs a graph holding only the collective, compiled and
launched under the process-wide graph lock (``runtime.graph_lock``): every device then runs the
same small program, which XLA's CPU backend (devices as threads) needs and TPUs do not mind.

    from accel_nb.xla import collectives
    collectives.all_gather(torch.tensor([rank]))        # tensor([0, 1]) on every device
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch

from . import runtime

__all__ = ["world_size", "rank", "all_gather", "all_reduce", "broadcast_", "gather_objects", "REDUCE_OPS"]

# ops.reduce's names -> torch_xla's reduce types ("mean" is a sum divided afterwards)
REDUCE_OPS = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "product": "mul"}


def world_size() -> int:
    return runtime.world_size()


def rank() -> int:
    return runtime.ordinal()


def _on_device(t: torch.Tensor) -> torch.Tensor:
    # bool is not a reduction type XLA's collectives take everywhere: carry it as uint8
    t = t.to(torch.uint8) if t.dtype == torch.bool else t
    return t.to(runtime.device())


def _collective(build: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> torch.Tensor:
    """``build(t on this device)``: pending work flushed, then the collective alone compiled and launched."""
    runtime.sync()  # what this device traced so far runs on its own (it may differ between ranks)
    runtime.devices_meet()  # no device flushes while another one's collective is launched
    with runtime.graph_lock():  # traced under the lock too (see runtime's docstring)
        out = build(_on_device(t))
    runtime.run_collective([out])  # its graph alone, the same program on every device, waited for
    return out


def _back(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``out`` in ``like``'s dtype and on its device (a CPU copy waits for the collective)."""
    if like.dtype == torch.bool:
        out = out != 0
    return out.to(like.device)


def all_gather(t: torch.Tensor) -> torch.Tensor:
    """Every device's ``t`` concatenated along dim 0 (shapes must agree), on ``t``'s device."""
    import torch_xla.core.xla_model as xm

    return _back(_collective(lambda x: xm.all_gather(x.contiguous(), dim=0, pin_layout=False), t), t)


def all_reduce(t: torch.Tensor, reduction: str) -> torch.Tensor:
    """``t`` combined elementwise over every device (``REDUCE_OPS`` names), as a new tensor on ``t``'s device."""
    import torch_xla.core.xla_model as xm

    kind = REDUCE_OPS[reduction]
    return _back(_collective(lambda x: xm.all_reduce(kind, x), t), t)


def broadcast_(t: torch.Tensor, src: int) -> torch.Tensor:
    """Overwrite ``t`` with device ``src``'s values (an all-reduce of ``t`` on ``src`` and zeros elsewhere)."""
    import torch_xla.core.xla_model as xm

    # the choice is data, not graph: every device must compile the same program
    mine = torch.tensor(rank() == src).to(runtime.device())

    def build(x: torch.Tensor) -> torch.Tensor:
        return xm.all_reduce(xm.REDUCE_SUM, torch.where(mine, x, torch.zeros_like(x)))

    result = _back(_collective(build, t), t)
    with torch.no_grad():
        t.copy_(result)
    return t


def gather_objects(obj: Any) -> list[Any]:
    """Every device's picklable ``obj``, in rank order (sizes first, then the padded bytes)."""
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = all_gather(torch.tensor([payload.numel()], dtype=torch.int64)).tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: payload.numel()] = payload
    rows = all_gather(padded.unsqueeze(0)).numpy()
    return [pickle.loads(rows[r, :n].tobytes()) for r, n in enumerate(sizes)]  # noqa: S301 - our own ranks' bytes
