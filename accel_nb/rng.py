"""Every random-number generator's state (python, numpy, torch, CUDA, XLA), saved and restored for exact resumes.

    state = rng_state()
    ...                      # draws
    set_rng_state(state)     # the same draws again
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from .xla import runtime as xla_runtime


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


# -- which generators Accelerator(rng_types=...) synchronises (accel_nb.random_sync does it) ---------
RNG_TYPES = ("torch", "cuda", "generator", "xla")


def check_rng_types(rng_types: Any, device: torch.device) -> list[str] | None:
    """Validate ``Accelerator(rng_types=...)`` for this process's device; None when nothing is synced.

    check_rng_types(["torch", "generator"], torch.device("cpu"))   # ['torch', 'generator']
    """
    if rng_types is None:
        return None
    if isinstance(rng_types, str) or not all(isinstance(t, str) for t in rng_types):
        raise TypeError(f"rng_types={rng_types!r} must be a list of names such as ['torch', 'generator']")
    chosen = [t.strip().lower() for t in rng_types]
    unknown = [t for t in chosen if t not in RNG_TYPES]
    if unknown:
        raise ValueError(f"rng_types: {unknown[0]!r} is not one of {', '.join(RNG_TYPES)}")
    if "xla" in chosen and torch.device(device).type != "xla":
        raise ValueError(
            f"rng_types: 'xla' needs the XLA device path (torch_xla with PJRT_DEVICE=TPU or CPU), but this "
            f"process runs on {device}; drop 'xla' (use 'torch' and 'generator')"
        )
    if "cuda" in chosen and torch.device(device).type != "cuda":
        raise ValueError(
            f"rng_types: 'cuda' synchronises the CUDA generator, but this process runs on {device}; "
            "drop 'cuda' (use 'torch' and 'generator')"
        )
    return chosen
