"""Is it safe to fork this process? GPU facts without creating a CUDA context in the parent.

Forking after CUDA was initialised gives children a broken CUDA, so the launcher switches to
spawn. ``install_cuda_init_recorder()`` (run when the extension or launcher loads) remembers
where CUDA was first initialised, so the switch can name the user's line that did it.

    reason = fork_unsafe_reason()        # None when fork is safe
    n = gpu_count()                      # through NVML: no CUDA context is created
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import traceback
from typing import Any

SIMULATE_ENV = "ACCEL_NB_SIMULATE_CUDA_INITIALIZED"

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


# ---------------------------------------------------------------------------- NVML (no CUDA context)
_nvml: Any = None
_nvml_tried = False


def _nvml_lib() -> Any:
    global _nvml, _nvml_tried
    if _nvml_tried:
        return _nvml
    _nvml_tried = True
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.nvmlInit_v2() == 0:
                _nvml = lib
                break
        except AttributeError:
            continue
    return _nvml


def _visible_indices(total: int) -> list[int]:
    """NVML indices that CUDA_VISIBLE_DEVICES lets CUDA see (numeric lists only; else all)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(total))
    raw = raw.strip()
    if raw == "" or raw == "-1":
        return []
    out: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit():  # UUIDs or MIG names: trust NVML's count
            return list(range(total))
        if int(part) >= total:
            break
        out.append(int(part))
    return out


def _nvml_device_count() -> int:
    lib = _nvml_lib()
    if lib is None:
        return 0
    count = ctypes.c_uint(0)
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return 0
    return len(_visible_indices(count.value))


def gpu_count() -> int:
    """CUDA GPUs this process could use, from NVML (0 when there is no NVIDIA driver); no CUDA context."""
    try:
        from accel_nb import hardware  # the config engineer's detector, when present

        fn = getattr(hardware, "cuda_device_count", None)
        if fn is not None:
            return int(fn())
    except Exception:
        pass
    return _nvml_device_count()


def gpu_info(index: int) -> tuple[str, tuple[int, int]] | None:
    """(name, (major, minor) compute capability) of visible GPU ``index`` through NVML, or None."""
    lib = _nvml_lib()
    if lib is None:
        return None
    count = ctypes.c_uint(0)
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return None
    visible = _visible_indices(count.value)
    if index >= len(visible):
        return None
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(visible[index], ctypes.byref(handle)) != 0:
        return None
    name = ctypes.create_string_buffer(96)
    lib.nvmlDeviceGetName(handle, name, 96)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
        return None
    return name.value.decode(errors="replace"), (major.value, minor.value)


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
    """Has this process initialised CUDA (torch or any other library)? Patchable for tests."""
    if os.environ.get(SIMULATE_ENV, "").strip().lower() in ("1", "true", "yes"):
        return True
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return True
        except Exception:
            pass
    return _driver_initialised()


def fork_unsafe_reason() -> str | None:
    """Why forking this process would be unsafe, or None when fork is fine."""
    if not hasattr(os, "fork"):
        return "this platform cannot fork"
    if sys.platform == "darwin":
        return "forking is unsafe on macOS"
    if cuda_initialized():
        origin = cuda_init_origin()
        if os.environ.get(SIMULATE_ENV) and origin is None:
            return f"CUDA was initialised in this kernel before the launch (simulated by {SIMULATE_ENV})"
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


def install_cuda_init_recorder() -> bool:
    """Wrap ``torch.cuda._lazy_init`` to remember the stack of the first CUDA initialisation.

    Only when torch is already imported (it never imports torch itself). Returns True once installed.
    """
    global _recorder_installed
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    with _recorder_lock:
        if _recorder_installed:
            return True
        cuda = getattr(torch, "cuda", None)
        original = getattr(cuda, "_lazy_init", None)
        if original is None or getattr(original, "_accel_nb_recorder", False):
            _recorder_installed = original is not None
            return _recorder_installed

        def _lazy_init_recording(*args: Any, **kwargs: Any) -> Any:
            global _first_init_stack
            if _first_init_stack is None:
                try:
                    if not cuda.is_initialized():
                        _first_init_stack = traceback.extract_stack()[:-1]
                except Exception:
                    pass
            return original(*args, **kwargs)

        _lazy_init_recording._accel_nb_recorder = True  # type: ignore[attr-defined]
        _lazy_init_recording.__wrapped__ = original  # type: ignore[attr-defined]
        cuda._lazy_init = _lazy_init_recording
        _recorder_installed = True
        return True
