"""Pre-import, once per kernel, what every forked rank would otherwise import at every launch.

A rank imports torch when the notebook has not, and building ``DistributedDataParallel`` (or an
optimizer) imports ``torch._dynamo`` (with sympy: some 800 modules, seconds of CPU) lazily, in
every rank, at every launch. A kernel imports them once so forked ranks inherit them: in a
background thread while the kernel is idle (from the end of the cell that imported the launcher
until the next cell starts, which waits for it), or at the first launch if no idle time came first.
The spawn server (``zygote``) does the same in its own process after the first launch's last rank
is forked. The imports touch no GPU and leave ``os.environ`` as it was.

The thread never runs beside the user's own code: torch's import is not safe from two threads at
once (a main thread importing ``torch.distributed...`` while the thread is inside ``torch/__init__``
gets a half-initialised torch, and torch's C++ start-up then aborts the process with
"terminate called after throwing an instance of 'python_error'"). So outside a kernel, where the
main thread never idles, nothing is imported in the background. While the thread runs, a forked
child would inherit import locks nobody releases, so every fork of the process waits for it too
(``os.register_at_fork``), the launcher's or anyone else's.

    preimport.start_in_kernel()  # the launcher was imported (or a fork launch ran) in a kernel
    preimport.finish()           # before a launch: the import is over, in one thread or the other
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any

from ..availability import in_ipython_kernel

# what a training rank imports when the notebook has not: torch itself, and what the first
# DistributedDataParallel(...) / optimizer of a rank imports lazily (torch._dynamo, with sympy)
MODULES = ("torch", "torch.distributed", "torch._dynamo", "accel_nb.accelerator.accelerator")

SET_ON_IMPORT = ("TORCHINDUCTOR_CACHE_DIR",)  # environment variables those imports set: put back after

_thread: threading.Thread | None = None
_lock = threading.Lock()
_scheduled = False  # start_when_idle() was called: a kernel wants the import, between cells or at finish()
_ran = False  # the import was started (in the thread) or done (by finish()): never twice
failures: dict[str, str] = {}  # module -> why it could not be imported (the ranks then import it themselves)


def import_modules() -> None:
    """Import every module of ``MODULES`` now (a failure is remembered in ``failures``, not raised).

    The notebook's environment is left as it was (torch._inductor sets TORCHINDUCTOR_CACHE_DIR on import).
    """
    before = {key: os.environ.get(key) for key in SET_ON_IMPORT}
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a broken optional import: the ranks will meet it themselves
            failures[name] = f"{type(exc).__name__}: {exc}"
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def done() -> bool:
    """True when every module of ``MODULES`` is already imported in this process."""
    return all(name in sys.modules for name in MODULES)


def start() -> None:
    """Import ``MODULES`` in a background thread, once per process.

    Only where nothing else imports meanwhile: the spawn server's loop, or a kernel between cells
    (``start_when_idle``); a thread importing torch beside code that imports torch can abort the process.
    """
    global _thread, _ran
    with _lock:
        if _ran or done():
            return
        _ran = True
        _thread = threading.Thread(target=import_modules, name="accel_nb-preimport", daemon=True)
        _thread.start()


def wait() -> None:
    """Block until the background import (if any) is over: no import lock is held after this returns."""
    thread = _thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join()


def finish() -> None:
    """Before a launch: the background import is over, and one that a kernel scheduled but that has
    not started yet (no idle moment since) is done now, in this thread, so the first ranks inherit it.
    Outside a kernel nothing was scheduled and nothing is imported."""
    global _ran
    wait()
    with _lock:
        if not _scheduled or _ran or done():
            return
        _ran = True
    import_modules()


def _start_after_cell(*_args: Any) -> None:  # IPython's post_run_cell: the kernel is about to idle
    start()


def _wait_before_cell(*_args: Any) -> None:  # IPython's pre_run_cell: the user's code runs alone
    wait()


def start_when_idle(shell: Any) -> None:
    """Schedule the import in ``shell`` (an IPython kernel's shell): a background thread starts when
    the running cell ends, and every cell waits for it before it runs, so it never runs beside the
    user's code. Once per process; ``finish()`` does it at once if a launch comes before the cell ends."""
    global _scheduled
    with _lock:
        if _scheduled or _ran:
            return
        _scheduled = True
    shell.events.register("post_run_cell", _start_after_cell)
    shell.events.register("pre_run_cell", _wait_before_cell)


def start_in_kernel() -> None:
    """``start_when_idle`` with this process's kernel shell; nothing outside a Jupyter kernel."""
    if in_ipython_kernel():
        start_when_idle(sys.modules["IPython"].get_ipython())


# any fork of this process (a DataLoader's workers, multiprocessing...) waits for the import too
os.register_at_fork(before=wait)
