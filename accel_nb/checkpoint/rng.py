"""Every random-number generator's state (python, numpy, torch, CUDA, XLA), saved and restored for exact resumes.

Example:
    state = rng_state()
    ...                      # draws
    set_rng_state(state)     # the same draws again
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ..xla import runtime as xla_runtime


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch (and CUDA) RNG states, in a weights_only-loadable form."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if xla_runtime.in_use():
        state["xla"] = xla_runtime.rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state()`` returned."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "xla" in state and xla_runtime.in_use():
        xla_runtime.set_rng_state(state["xla"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
