"""Atomic file writes, the one implementation: a temp file beside the target, fsync, rename.

A reader sees the old file or the new one, never half of one; a write that fails (or is killed)
leaves the old file and removes its temp file. Light on purpose: no torch, so the launch config
can use it from the ``accel-nb`` command.

    atomic_write_bytes("weights.json", b"{}")
    atomic_write("model.pt", lambda tmp: torch.save(obj, tmp))
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def fsync_path(path: str) -> None:
    """Flush a file (or a directory's entry list) to disk."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories; the data is written either way
        pass
    finally:
        os.close(fd)


def temp_path_beside(path: str) -> str:
    """A new, empty temp file in ``path``'s folder (same filesystem, so the final rename is atomic)."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{name}-{os.getpid()}-", dir=folder)
    os.close(fd)
    return tmp


def atomic_write(path: str, write: Callable[[str], object], mode: int | None = None) -> None:
    """Call ``write(tmp)`` to fill a temp file beside ``path``, fsync it, then rename it over ``path``.

    ``mode`` sets the file's permissions (temp files start as 0o600).

        atomic_write("cfg.yaml", lambda tmp: open(tmp, "w").write(text), mode=0o644)
    """
    tmp = temp_path_beside(path)
    try:
        write(tmp)
        fsync_path(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:  # any failure, Ctrl-C included: drop the temp file, then re-raise
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically."""

    def _write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write(path, _write, mode)
