"""Memory helpers: free what a run holds, empty the device cache, find a batch size that fits.

Example:
    @find_executable_batch_size(starting_batch_size=256)
    def train(batch_size):
        ...                       # retried with 0.9x the batch size after an out-of-memory error
    train()
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

from .counts import is_count

__all__ = [
    "clear_device_cache",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
]

# Messages of the errors a smaller batch can cure: device and host allocators out of memory, and
# cuDNN refusing a shape. Matched inside RuntimeError messages, as raised by torch.
_OOM_MESSAGES = (
    " out of memory.",  # CUDA, HIP, XPU, NPU, MLU and torch's "CPU out of memory."
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "XPU out of memory.",
    "MPS backend out of memory",
    "NPU out of memory.",
    "HPU out of memory",
    "MLU out of memory.",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return cached, unused device memory to the driver (CUDA, XPU, MPS); optionally ``gc.collect()`` first.

    clear_device_cache(garbage_collection=True)
    """
    import torch

    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        xpu.empty_cache()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        torch.mps.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop these references, collect garbage, empty the device cache; assign the Nones back.

    model, optimizer = release_memory(model, optimizer)
    """
    objects = list(objects)
    for i in range(len(objects)):
        objects[i] = None
    clear_device_cache(garbage_collection=True)
    return objects


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` is an out-of-memory (device or host) or cuDNN not-supported error.

    should_reduce_batch_size(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))  # True
    """
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exception, oom_type):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(message in str(exception.args[0]) for message in _OOM_MESSAGES)
    return False


def _check_call(function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Refuse a call that passes the batch size itself (the decorator passes it)."""
    name = getattr(function, "__name__", "function")
    if "batch_size" in kwargs:
        raise TypeError(
            f"{name}() got batch_size=...; remove it, find_executable_batch_size passes the batch size"
        )
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    if not takes_varargs and len(args) > len(positional):  # args = (batch size, *the caller's args)
        shown = ", ".join(f"{p.name}={a!r}" for p, a in zip(positional[1:], args[2:], strict=False))
        raise TypeError(
            f"{name}() was called with the batch size as its first argument; find_executable_batch_size "
            f"passes it: call {name}({shown}) instead"
        )


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Call ``function(batch_size, ...)``, retrying with a smaller batch after out-of-memory errors.

    The first attempt uses ``starting_batch_size``; after each out-of-memory error (see
    ``should_reduce_batch_size``) memory is released and the batch size becomes
    ``int(0.9 * batch_size)`` (or ``reduce_batch_size_fn()``). Other errors propagate; reaching 0
    raises ``RuntimeError``.

        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size, model):
            ...
        train(model)
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    if not is_count(starting_batch_size, low=0):
        raise ValueError(f"starting_batch_size={starting_batch_size!r} must be a whole number >= 1")
    # 0 is accepted here and fails at the call with RuntimeError, as in the reference

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        batch_size = starting_batch_size
        clear_device_cache(garbage_collection=True)
        _check_call(function, (batch_size, *args), kwargs)
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    f"No executable batch size found, reached zero: no batch size from {starting_batch_size} "
                    "down to 1 ran without running out of memory; use a smaller model or more memory"
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                del exc  # drop the traceback's frames (and the tensors they hold) before retrying
                clear_device_cache(garbage_collection=True)
                batch_size = (
                    int(reduce_batch_size_fn()) if reduce_batch_size_fn is not None else int(batch_size * 0.9)
                )

    return run
