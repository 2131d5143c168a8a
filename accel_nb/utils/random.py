"""Shim at the reference's ``accelerate.utils.random`` path: seeding and RNG synchronisation.

    from accel_nb.utils.random import set_seed, synchronize_rng_states

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(["set_seed"], "accel_nb.misc"),
    **dict.fromkeys(["synchronize_rng_state", "synchronize_rng_states"], "accel_nb.data.random_sync"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
