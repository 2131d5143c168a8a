"""Launches with the kernel's debugger on: ranks are not children of the debugger.

The kernel's debugger is debugpy (pydevd), switched on by JupyterLab's bug icon, by opening a file
through it, or by VS Code's "Debug Cell". It patches ``os.fork`` and the subprocess machinery so
that every child process connects back to it: a forked rank then waits for a debugger session the
front-end never opens, and a spawned Python is started through debugpy. Before this module a
launch sat at "starting" forever with the debugger on.

accel_nb's ranks are never debugged by the kernel's debugger (a ``breakpoint()`` in a rank is the
way into a rank: docs/debugging.md), so:

- ranks are forked with the fork debugpy saved (``os.original_fork``), not its patched one;
- a forked rank drops the tracer it inherited (``drop_inherited_tracer``);
- subprocesses (the spawn server, spawned ranks) start without debugpy's argument patching
  (``unpatched_subprocesses``).

With no debugger in the process each of these is the plain operation.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator


def fork() -> int:
    """``os.fork()`` without debugpy's fork hook (the child would wait to be attached)."""
    return getattr(os, "original_fork", os.fork)()


def drop_inherited_tracer() -> None:
    """In a forked rank: no trace function, no pydevd debugger (its threads did not survive the fork)."""
    if "pydevd" not in sys.modules:
        return
    tracing = sys.modules.get("pydevd_tracing")  # pydevd replaced sys.settrace with one that warns
    holder = getattr(tracing, "TracingFunctionHolder", None)
    original = getattr(holder, "_original_tracing", None)
    if original is not None:
        sys.settrace = original  # pdb in the rank (a breakpoint()) sets its tracer without a warning
    sys.settrace(None)
    threading.settrace(None)
    constants = sys.modules.get("_pydevd_bundle.pydevd_constants")
    setter = getattr(constants, "set_global_debugger", None)
    if setter is not None:
        with contextlib.suppress(Exception):
            setter(None)


@contextlib.contextmanager
def unpatched_subprocesses() -> Iterator[None]:
    """Start Python subprocesses as written, not through debugpy (this thread, inside the block)."""
    monkey = sys.modules.get("_pydev_bundle.pydev_monkey")
    skip = getattr(monkey, "skip_subprocess_arg_patch", None)
    if skip is None:
        yield
        return
    with skip():
        yield
