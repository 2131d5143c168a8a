"""Checkpoint folders: which ones are complete, their names, and the atomic move into place.

A folder is a checkpoint only once its manifest exists; saves write into ``.tmp-<name>-<pid>``
and ``commit_dir`` renames it into place (an older checkpoint there is moved aside, then removed).
"""

from __future__ import annotations

import os
import re
import shutil

from ..serialization import fsync_path

MANIFEST_NAME = "checkpoint.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_complete_checkpoint(path: str) -> bool:
    """A folder is a checkpoint only once its manifest was written (the last step of a save)."""
    return os.path.isfile(os.path.join(path, MANIFEST_NAME))


def list_checkpoints(project_dir_or_checkpoints: str) -> list[str]:
    """Complete ``checkpoint_<i>`` folders, oldest first (temp and half-written folders skipped)."""
    root = project_dir_or_checkpoints
    if os.path.isdir(os.path.join(root, "checkpoints")):
        root = os.path.join(root, "checkpoints")
    if not os.path.isdir(root):
        return []
    found = []
    for entry in os.listdir(root):
        m = CHECKPOINT_DIR.match(entry)
        if m and is_complete_checkpoint(os.path.join(root, entry)):
            found.append((int(m.group(1)), os.path.join(root, entry)))
    return [p for _, p in sorted(found)]


def next_iteration(root: str, iteration: int) -> int:
    taken = [
        int(m.group(1))
        for e in (os.listdir(root) if os.path.isdir(root) else [])
        if (m := CHECKPOINT_DIR.match(e))
    ]
    return max([iteration] + [t + 1 for t in taken])


def remove_stale_temps(parent: str, name: str) -> None:
    """Remove temp folders of saves that died (their process is gone), for ``name`` or any
    ``checkpoint_<i>`` when ``name`` is one."""
    names = r"checkpoint_\d+" if CHECKPOINT_DIR.match(name) else re.escape(name)
    pattern = re.compile(r"^\.(tmp|old)-(" + names + r")-(\d+)$")
    for entry in os.listdir(parent):
        m = pattern.match(entry)
        if not m or (int(m.group(3)) != os.getpid() and _pid_alive(int(m.group(3)))):
            continue
        stale, target = os.path.join(parent, entry), os.path.join(parent, m.group(2))
        if m.group(1) == "old" and is_complete_checkpoint(stale) and not is_complete_checkpoint(target):
            # the save died between moving the old checkpoint away and moving the new one in
            if os.path.isdir(target):
                shutil.rmtree(target, ignore_errors=True)
            os.rename(stale, target)
        else:
            shutil.rmtree(stale, ignore_errors=True)


def commit_dir(tmp: str, final: str) -> None:
    """Move the finished temp folder into place; an older checkpoint there is replaced."""
    parent, name = os.path.split(final)
    fsync_path(tmp)
    if os.path.exists(final):
        old = os.path.join(parent, f".old-{name}-{os.getpid()}")
        os.rename(final, old)
        os.rename(tmp, final)
        fsync_path(parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_path(parent)
