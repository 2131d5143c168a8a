"""The launch environment a process reads: accel_nb's variables (also under the reference
library's spellings), the rank topology torchrun or accel_nb's launcher describes, and the device a
variable names.

    topo = read_topology()      # {"world_size": 2, "rank": 1, "local_rank": 1, ...}, validated
    env_value("ACCEL_NB_MIXED_PRECISION", "no")
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .env_names import ENV_TORCH_DEVICE, REFERENCE_NAMES

__all__ = ["TopologyError", "env_flag", "env_value", "read_topology", "requested_device"]


def env_value(name: str, default: str | None = None) -> str | None:
    """Read an accel_nb variable, falling back to the reference library's spelling of it."""
    value = os.environ.get(name)
    if value is None and name in REFERENCE_NAMES:
        value = os.environ.get(REFERENCE_NAMES[name])
    return default if value is None or value == "" else value


def env_flag(name: str) -> bool:
    return str(env_value(name, "0")).strip().lower() in ("1", "true", "yes", "on")


class TopologyError(ValueError):
    """The launch environment describes an impossible topology (e.g. RANK >= WORLD_SIZE)."""


def _int_env(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise TopologyError(
            f"{name}={raw!r} is not an integer; the launcher must set it to a whole number"
        ) from None


def read_topology() -> dict[str, Any]:
    """The topology the environment describes, validated. Raises ``TopologyError`` when it disagrees."""
    world_size = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    local_rank = _int_env("LOCAL_RANK", None)
    local_world_size = _int_env("LOCAL_WORLD_SIZE", None)
    if world_size < 1:
        raise TopologyError(f"WORLD_SIZE={world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise TopologyError(
            f"RANK={rank} does not fit WORLD_SIZE={world_size}: ranks go from 0 to {world_size - 1}. "
            "Set RANK and WORLD_SIZE from the same launch (torchrun, accel-nb launch or notebook_launcher)."
        )
    if local_rank is None:
        local_rank = rank if world_size > 1 and local_world_size in (None, world_size) else 0
    if local_world_size is None:
        local_world_size = world_size if "LOCAL_RANK" not in os.environ else max(local_rank + 1, 1)
    if not 0 <= local_rank < max(local_world_size, 1):
        raise TopologyError(
            f"LOCAL_RANK={local_rank} does not fit LOCAL_WORLD_SIZE={local_world_size}: "
            f"local ranks go from 0 to {local_world_size - 1}."
        )
    if local_world_size > world_size:
        raise TopologyError(f"LOCAL_WORLD_SIZE={local_world_size} is larger than WORLD_SIZE={world_size}")
    topo = {
        "world_size": world_size,
        "rank": rank,
        "local_rank": local_rank,
        "local_world_size": local_world_size,
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": _int_env("MASTER_PORT", None),
    }
    if world_size > 1 and (not topo["master_addr"] or topo["master_port"] is None):
        raise TopologyError(
            f"WORLD_SIZE={world_size} but MASTER_ADDR/MASTER_PORT are not set: every rank needs the "
            "address of rank 0. Launch with notebook_launcher, accel-nb launch or torchrun, which set them."
        )
    return topo


def requested_device(cpu: bool) -> torch.device | None:
    """The device named by ``ACCEL_NB_TORCH_DEVICE`` (or the reference's ``ACCELERATE_TORCH_DEVICE``).

    As in the reference, the named device is used as given (no ``torch.cuda.set_device``); the
    backend follows its type (nccl for a CUDA device, gloo otherwise).
    """
    value = env_value(ENV_TORCH_DEVICE)
    if value is None:
        return None
    name = ENV_TORCH_DEVICE if os.environ.get(ENV_TORCH_DEVICE) else REFERENCE_NAMES[ENV_TORCH_DEVICE]
    try:
        device = torch.device(value)
    except RuntimeError as exc:
        raise ValueError(
            f"{name}={value!r} is not a torch device ({exc}); set it to e.g. 'cpu', 'cuda' or 'cuda:1', or unset it"
        ) from None
    if device.type == "cuda" and (cpu or not torch.cuda.is_available()):
        why = "cpu=True was given" if cpu else "CUDA is not available on this machine"
        raise ValueError(f"{name}={value!r} names a CUDA device but {why}; unset {name} or set it to 'cpu'")
    return device
