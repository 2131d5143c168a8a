"""Per-launch log folders that do not outlive their owner for long.

    folder = make_log_dir("accel_nb-launch-")   # this process holds it (an flock on folder/.owner)
    ...
    remove_log_dir(folder)                        # at the end of the launch (or later, when kept)

A launch keeps its folder while a failure names it, and removes it when it ends. A process that dies
without that step (a kernel killed by its manager, SIGKILL, ``os._exit``) leaves the folder behind;
its lock goes with it (the kernel drops an flock when the last holder exits), so the next
``make_log_dir`` of any process removes the folders no live process holds. Ranks started by fork
share the lock: a folder whose ranks still run is kept. A folder without the owner file (one being
made, or one an older release left) is left alone. Where ``fcntl`` is missing nothing is swept.
"""

from __future__ import annotations

import os
import shutil
import tempfile

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: folders are removed by their owners only
    fcntl = None  # type: ignore[assignment]

OWNER_FILE = ".owner"
_held: dict[str, int] = {}  # folder -> the descriptor that holds its lock


def make_log_dir(prefix: str) -> str:
    """A new folder in the temp dir, held by this process; first, folders of dead owners are removed."""
    sweep_orphans(prefix)
    folder = tempfile.mkdtemp(prefix=prefix)
    if fcntl is not None:
        fd = os.open(os.path.join(folder, OWNER_FILE), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _held[folder] = fd
    return folder


def remove_log_dir(folder: str) -> None:
    """Remove ``folder`` and let go of its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    fd = _held.pop(folder, None)
    if fd is not None:
        os.close(fd)


def keep_log_dir(folder: str) -> None:
    """Keep ``folder`` for good (``ACCEL_NB_KEEP_LOGS``): without its owner file no sweep removes it."""
    fd = _held.pop(folder, None)
    if fd is not None:
        try:
            os.remove(os.path.join(folder, OWNER_FILE))
        except OSError:
            pass
        os.close(fd)


def sweep_orphans(prefix: str) -> list[str]:
    """Remove the temp dir's ``prefix*`` folders whose owner file no process holds; returns them."""
    if fcntl is None:
        return []
    root = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        folder = os.path.join(root, name)
        if folder in _held:
            continue
        try:
            fd = os.open(os.path.join(folder, OWNER_FILE), os.O_RDWR)
        except OSError:  # no owner file: being made, not ours, or an older release's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner, or ranks it forked, still run
            os.close(fd)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        removed.append(folder)
    return removed
