"""Shim at the reference's ``accelerate.hooks`` path; the hooks live in ``accel_nb.big_model.model_hooks``.

    from accel_nb.hooks import ModelHook, add_hook_to_module, cpu_offload_with_hook

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .reexports import reexports

_EXPORTS = dict.fromkeys(
    [
        "AlignDevicesHook",
        "CpuOffload",
        "ModelHook",
        "SequentialHook",
        "UserCpuOffloadHook",
        "add_hook_to_module",
        "attach_align_device_hook",
        "cpu_offload_with_hook",
        "iter_hooks",
        "remove_hook_from_module",
        "remove_hook_from_submodules",
    ],
    "accel_nb.big_model.model_hooks",
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
