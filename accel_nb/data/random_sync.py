"""Make every process's random number generators equal to the main process's.

    synchronize_rng_states(["torch", "generator"], generator=loader_generator)

Each process then draws the same random numbers (the same shuffle, the same dropout mask) from
that point on. Outside a process group it does nothing. ``check_rng_types`` validates
``Accelerator(rng_types=...)`` against the generators synchronised here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import torch

from ..ops import broadcast_object_list, rank, world_size
from ..xla import runtime

__all__ = ["RNGType", "RNG_TYPES", "check_rng_types", "synchronize_rng_state", "synchronize_rng_states"]


class RNGType(str, enum.Enum):
    """Which generator to synchronise (the reference library's names and values)."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


_SUPPORTED = (RNGType.TORCH, RNGType.CUDA, RNGType.GENERATOR, RNGType.XLA)

# the names Accelerator(rng_types=...) accepts: the generators synchronised here
RNG_TYPES = tuple(t.value for t in _SUPPORTED)


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


def _rng_type(value: Any) -> RNGType:
    try:
        kind = RNGType(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        raise ValueError(
            f"unknown rng type {value!r}; use one of {', '.join(repr(t.value) for t in RNGType)}"
        ) from None
    if kind not in _SUPPORTED:
        raise NotImplementedError(
            f"synchronizing the {kind.value!r} generator is not supported by accel_nb; it synchronizes "
            f"{', '.join(repr(t.value) for t in _SUPPORTED)}"
        )
    return kind


def _read(kind: RNGType, generator: torch.Generator | None) -> torch.Tensor | None:
    if kind is RNGType.TORCH:
        return torch.get_rng_state()
    if kind is RNGType.CUDA:
        return torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    if kind is RNGType.XLA:  # the device's seed state, an unsigned 64-bit integer: two 32-bit halves
        seed = runtime.rng_state()
        return torch.tensor([seed >> 32, seed & 0xFFFFFFFF], dtype=torch.int64)
    return generator.get_state()


def _write(kind: RNGType, state: torch.Tensor, generator: torch.Generator | None) -> None:
    if kind is RNGType.TORCH:
        torch.set_rng_state(state)
    elif kind is RNGType.CUDA:
        torch.cuda.set_rng_state_all([state] * torch.cuda.device_count())
    elif kind is RNGType.XLA:
        runtime.set_rng_state((int(state[0]) << 32) | int(state[1]))
    else:
        generator.set_state(state)


def synchronize_rng_state(
    rng_type: RNGType | str | None = None, generator: torch.Generator | None = None
) -> None:
    """Copy the main process's state of one generator to every process.

    ``"torch"`` is the global CPU generator, ``"cuda"`` the CUDA generators of this process (nothing
    to do without CUDA), ``"generator"`` the ``generator`` passed (nothing to do when it is None).

        synchronize_rng_state("torch")
    """
    kind = _rng_type(rng_type if rng_type is not None else RNGType.TORCH)
    if kind is RNGType.GENERATOR and generator is None:
        return
    if kind is RNGType.XLA and not runtime.in_use():
        raise ValueError(
            "synchronizing the 'xla' generator needs a run on XLA devices (torch_xla, PJRT_DEVICE)"
        )
    if world_size() == 1:  # one process (also outside a process group)
        return
    if kind is RNGType.CUDA and not torch.cuda.is_available():
        return

    state = _read(kind, generator)
    payload = [state.cpu() if rank() == 0 else None]
    broadcast_object_list(payload, from_process=0)
    _write(kind, payload[0], generator)


def synchronize_rng_states(
    rng_types: Iterable[RNGType | str], generator: torch.Generator | None = None
) -> None:
    """``synchronize_rng_state`` for each type in ``rng_types``.

    synchronize_rng_states(["torch", "generator"], generator=g)
    """
    kinds = [_rng_type(t) for t in rng_types]  # check them all before the first collective
    for kind in kinds:
        synchronize_rng_state(kind, generator)
