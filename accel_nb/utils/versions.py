"""Shim at the reference's ``accelerate.utils.versions`` path: version comparisons.

    from accel_nb.utils.versions import compare_versions, is_torch_version

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(["compare_versions", "is_torch_version"], "accel_nb.availability"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
