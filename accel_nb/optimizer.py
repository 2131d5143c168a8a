"""Shim at the reference's ``accelerate.optimizer`` path: the optimizer wrapper ``prepare`` returns.

    from accel_nb.optimizer import AcceleratedOptimizer

Nothing is defined here; ``AcceleratedOptimizer`` is ``accel_nb.accelerator.optim``'s, imported on
first use with the other names the reference's module has (accel_nb.reexports).
"""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .reexports import reexports

_EXPORTS = reexports(__name__)  # as in the reference (no __all__ there), ``import *`` gives every name
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
