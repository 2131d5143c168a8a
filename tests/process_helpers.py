"""What a launch left running: live descendants of a process, except the warm spawn server.

Example:
    assert live_descendants(psutil.Process()) == []
    assert_no_descendants(psutil.Process(kernel.pid), within=5)   # waits for ranks being reaped
"""

from __future__ import annotations

import time

import psutil


def is_spawn_server(proc: psutil.Process) -> bool:
    """The warm spawn server stays between launches (with no rank), so it does not count as left over."""
    try:
        return "accel_nb.launch.zygote" in " ".join(proc.cmdline())
    except psutil.Error:  # gone meanwhile
        return False


def live_descendants(proc: psutil.Process) -> list[psutil.Process]:
    """Descendants of ``proc`` that still run (zombies and the spawn server left out)."""
    try:
        children = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not is_spawn_server(child):
                out.append(child)
        except psutil.Error:  # gone meanwhile
            pass
    return out


def assert_no_descendants(proc: psutil.Process, within: float = 5.0) -> None:
    """Fail unless every descendant of ``proc`` (but the spawn server) is gone within ``within`` seconds."""
    deadline = time.monotonic() + within
    while live_descendants(proc) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_descendants(proc) == []
