"""Shim at the reference's ``accelerate.checkpointing`` path: the checkpoint file names and helpers it imports.

    from accel_nb.checkpointing import SAFE_WEIGHTS_NAME, OPTIMIZER_NAME

Nothing is defined here; each name is accel_nb's one implementation (accel_nb.reexports), imported on
first use. The reference's ``save_accelerator_state`` / ``load_accelerator_state`` here take a
checkpoint's parts one by one; accel_nb's are what ``Accelerator.save_state`` / ``load_state`` run
(``accel_nb.checkpoint``), so they are left out (docs/migration.md).
"""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .reexports import reexports

_EXPORTS = reexports(__name__)  # as in the reference (no __all__ there), ``import *`` gives every name
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
