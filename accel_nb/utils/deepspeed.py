"""Shim at the reference's ``accelerate.utils.deepspeed`` path: what ``prepare`` returns under DeepSpeed.

    from accel_nb.utils.deepspeed import DummyOptim, DummyScheduler

Nothing is defined here; each name is accel_nb's one implementation (``accel_nb.deepspeed``), imported
on first use, so importing this path does not import the ``deepspeed`` package.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = dict.fromkeys(
    [
        "DeepSpeedEngineWrapper",
        "DeepSpeedOptimizerWrapper",
        "DeepSpeedSchedulerWrapper",
        "DummyOptim",
        "DummyScheduler",
    ],
    "accel_nb.deepspeed",
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})
