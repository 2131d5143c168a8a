"""Shared pieces of the safetensors layout: names, the error type, sizes and atomic file writes."""

from __future__ import annotations

from typing import Any

import torch

from ..atomic_files import atomic_write, atomic_write_bytes, fsync_path
from ..byte_sizes import parse_size as _parse_size

__all__ = [
    "ALIASES_KEY",
    "SAVE_ID_KEY",
    "SAFE_WEIGHTS_NAME",
    "SAFE_INDEX_SUFFIX",
    "CheckpointError",
    "parse_size",
    "fsync_path",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_save_file",
    "atomic_torch_save",
]

ALIASES_KEY = "accel_nb.aliases"
SAVE_ID_KEY = "accel_nb.save_id"  # in every shard and the index: shards of one save belong together
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_INDEX_SUFFIX = ".index.json"


class CheckpointError(ValueError):
    """A checkpoint cannot be used as it is; the message names the file, the tensor and the fix."""


# -- sizes ------------------------------------------------------------------------------------------
def parse_size(size: int | str) -> int:
    """Bytes in a shard size: ``parse_size("10GB") == 10 * 10**9``, ``parse_size("2GiB") == 2 * 2**30``.

    parse_size("500MB")  # 500_000_000
    """
    return _parse_size(size, what="size", positive=True)


# -- atomic writes: one implementation, in accel_nb.atomic_files ------------------------------------
def atomic_save_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str]) -> None:
    """``safetensors.torch.save_file`` through a temp file and a rename."""
    from safetensors.torch import save_file

    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` through a temp file and a rename."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))
