"""Is it safe to fork this process? Whether CUDA was initialised here, and by which line.

Forking after CUDA was initialised gives children a broken CUDA, so the launcher switches to
spawn. ``install_cuda_init_recorder()`` (run when the extension or launcher loads) remembers
where CUDA was first initialised, so the switch can name the user's line that did it. GPU
counts and names come from :mod:`accel_nb.hardware` (NVML, no CUDA context).

    reason = fork_unsafe_reason()        # None when fork is safe
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import traceback
from typing import Any

from ..availability import imported_module

_first_init_stack: list[traceback.FrameSummary] | None = None
_recorder_lock = threading.Lock()
_recorder_installed = False

# frames from these places are library code, not the user's line that touched CUDA
_LIBRARY_MARKERS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}accel_nb{os.sep}",
    f"{os.sep}IPython{os.sep}",
    f"{os.sep}ipykernel{os.sep}",
    f"{os.sep}site-packages{os.sep}",
    f"{os.sep}dist-packages{os.sep}",
    "<frozen ",
)


# ---------------------------------------------------------------------------- fork safety
def _driver_initialised() -> bool:
    """True when the CUDA driver library is loaded in this process AND was initialised (cuInit)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):
        return False  # not loaded: nobody initialised CUDA here
    count = ctypes.c_int(0)
    try:
        # CUDA_ERROR_NOT_INITIALIZED (3) when cuInit was never called; does not initialise anything
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0
    except AttributeError:
        return False


def cuda_initialized() -> bool:
    """Has this process initialised CUDA (torch or any other library)?"""
    torch = imported_module("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    return _driver_initialised()


def fork_unsafe_reason() -> str | None:
    """Why forking this process would be unsafe, or None when fork is fine."""
    if not hasattr(os, "fork"):
        return "this platform cannot fork"
    if sys.platform == "darwin":
        return "forking is unsafe on macOS"
    if cuda_initialized():
        origin = cuda_init_origin()
        where = (
            f" by {origin}"
            if origin
            else " (load the extension first with %load_ext accel_nb to see which line did it)"
        )
        return f"CUDA was initialised in this kernel before the launch{where}"
    return None


# ---------------------------------------------------------------------------- who initialised CUDA
def _user_frame(stack: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    for frame in reversed(stack):
        fname = frame.filename or ""
        if any(marker in fname for marker in _LIBRARY_MARKERS):
            continue
        return frame
    return None


def cuda_init_origin() -> str | None:
    """``"line 3 of cell <...>: x = torch.ones(1).cuda()"`` for the first CUDA initialisation, if recorded."""
    stack = _first_init_stack
    if not stack:
        return None
    frame = _user_frame(stack)
    if frame is None:
        return None
    where = frame.filename
    if "ipykernel_" in where or where.startswith("<"):
        where = f"a notebook cell ({where})"
    code = (frame.line or "").strip()
    return f"line {frame.lineno} of {where}" + (f": {code}" if code else "")


def install_cuda_init_recorder() -> None:
    """Wrap ``torch.cuda._lazy_init`` to remember the stack of the first CUDA initialisation.

    Only when torch is already imported (it never imports torch itself); installing twice is a no-op.
    """
    global _recorder_installed
    torch = imported_module("torch")
    if torch is None:
        return
    with _recorder_lock:
        original = getattr(torch.cuda, "_lazy_init", None)
        if _recorder_installed or original is None or getattr(original, "_accel_nb_recorder", False):
            _recorder_installed = original is not None
            return
        cuda = torch.cuda

        def _lazy_init_recording(*args: Any, **kwargs: Any) -> Any:
            global _first_init_stack
            if _first_init_stack is None and not cuda.is_initialized():
                _first_init_stack = traceback.extract_stack()[:-1]
            return original(*args, **kwargs)

        _lazy_init_recording._accel_nb_recorder = True  # type: ignore[attr-defined]
        _lazy_init_recording.__wrapped__ = original  # type: ignore[attr-defined]
        cuda._lazy_init = _lazy_init_recording
        _recorder_installed = True
