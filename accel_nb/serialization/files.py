"""Shared pieces of the safetensors layout: names, the error type, sizes and atomic file writes."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from ..utils import parse_size as _parse_size

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


# -- low-level file helpers -------------------------------------------------------------------------
def fsync_path(path: str) -> None:
    """Flush a file (or a directory entry list) to disk."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _temp_path_beside(path: str) -> str:
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{name}-{os.getpid()}-", dir=folder)
    os.close(fd)
    return tmp


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file beside it, fsync, rename."""
    tmp = _temp_path_beside(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_save_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    tmp = _temp_path_beside(path)
    try:
        save_file(tensors, tmp, metadata=metadata)
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_torch_save(obj: Any, path: str) -> None:
    tmp = _temp_path_beside(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


