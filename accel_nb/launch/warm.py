"""Import once per kernel what every forked rank would otherwise import on its first DDP step.

Building ``DistributedDataParallel`` imports ``torch._dynamo`` (with sympy: some 800 modules,
seconds of CPU) lazily, in every rank, at every launch. After the first fork launch of a session
the notebook process imports it once, in a background thread, so later forked ranks inherit it.
The import touches no GPU and leaves ``os.environ`` as it was. A fork must never happen while that thread holds an import lock (the
child would inherit a lock nobody releases), so ``start_forked`` calls ``wait_until_warm()`` first.

    start_warming()        # after a fork launch started its ranks
    wait_until_warm()      # before the next fork
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

MODULES = ("torch._dynamo",)  # what the first DistributedDataParallel(...) of a rank imports

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


def warm() -> bool:
    """True when every module of ``MODULES`` is already imported in this process."""
    return all(name in sys.modules for name in MODULES)


def start_warming() -> None:
    """Import ``MODULES`` in a background thread, once per process, when torch is in use here."""
    global _thread
    with _lock:
        if _thread is not None or "torch" not in sys.modules or warm():
            return
        _thread = threading.Thread(target=import_modules, name="accel_nb-warm-imports", daemon=True)
        _thread.start()


def wait_until_warm() -> None:
    """Block until the background import (if any) is over: no import lock is held after this returns."""
    thread = _thread
    if thread is not None and thread.is_alive():
        thread.join()
