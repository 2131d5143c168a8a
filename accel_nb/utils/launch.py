"""Shim at the reference's ``accelerate.utils.launch`` path: the environment a launch gives its ranks.

    from accel_nb.utils.launch import prepare_multi_gpu_env

Nothing is defined here; the name is accel_nb's one implementation (``accel-nb launch``'s), imported on
first use. The reference's other launcher internals are left out (docs/migration.md says why).
"""

from __future__ import annotations

from typing import Any

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {"prepare_multi_gpu_env": "accel_nb.commands.launch_env"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """The reference's private helper, by its name: ``accel_nb.config.script_args.script_args_to_dict``."""
    from ..config.script_args import script_args_to_dict

    return script_args_to_dict(nargs)
