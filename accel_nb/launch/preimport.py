"""Pre-import, once per kernel, what every forked rank would otherwise import at every launch.

A rank imports torch when the notebook has not, and building ``DistributedDataParallel`` (or an
optimizer) imports ``torch._dynamo`` (with sympy: some 800 modules, seconds of CPU) lazily, in
every rank, at every launch. The notebook process imports them once, in a background thread, so
forked ranks inherit them: in a kernel as soon as the launcher is imported (the user is still
writing the training function), elsewhere after the first fork launch started its ranks. The
spawn server (``zygote``) does the same after the first launch's last rank is forked.
The imports touch no GPU and leave ``os.environ`` as it was. While they run, a half-imported torch
is in ``sys.modules`` and the thread may hold import locks (a forked child would inherit locks
nobody releases), so a launch first calls ``wait()``, and so does every fork of the
process (``os.register_at_fork``), the launcher's or anyone else's.

    preimport.start()      # the launcher was imported in a kernel, or a fork launch started its ranks
    preimport.wait()       # before the next fork
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

# what a training rank imports when the notebook has not: torch itself, and what the first
# DistributedDataParallel(...) / optimizer of a rank imports lazily (torch._dynamo, with sympy)
MODULES = ("torch", "torch.distributed", "torch._dynamo", "accel_nb.accelerator.accelerator")

SET_ON_IMPORT = ("TORCHINDUCTOR_CACHE_DIR",)  # environment variables those imports set: put back after

_thread: threading.Thread | None = None
_lock = threading.Lock()
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
    """Import ``MODULES`` in a background thread, once per process."""
    global _thread
    with _lock:
        if _thread is not None or done():
            return
        _thread = threading.Thread(target=import_modules, name="accel_nb-preimport", daemon=True)
        _thread.start()


def wait() -> None:
    """Block until the background import (if any) is over: no import lock is held after this returns."""
    thread = _thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join()


# any fork of this process (a DataLoader's workers, multiprocessing...) waits for the import too
os.register_at_fork(before=wait)
