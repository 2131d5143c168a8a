"""Shim at the reference's ``accelerate.utils.tqdm`` path: a progress bar on the local main process only.

    from accel_nb.utils.tqdm import tqdm

Nothing is defined here; the name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {"tqdm": "accel_nb.misc"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
