"""Shim at the reference's ``accelerate.utils.memory`` path: out-of-memory helpers.

    from accel_nb.utils.memory import find_executable_batch_size, release_memory

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(
        ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"],
        "accel_nb.memory",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
