"""Shim at the reference's ``accelerate.launchers`` path: ``notebook_launcher`` and ``debug_launcher``.

    from accel_nb.launchers import notebook_launcher

Nothing is defined here; each name is accel_nb's one implementation (``accel_nb.notebook.launcher``
and the helpers in accel_nb.reexports), imported on first use.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .reexports import reexports

_EXPORTS = reexports(__name__)  # as in the reference (no __all__ there), ``import *`` gives every name
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
