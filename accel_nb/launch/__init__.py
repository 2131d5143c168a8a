"""Launching a function or a cell on N processes: plan -> start -> supervise -> collect -> clean up.

Modules, one job each: ``plan`` (processes, start method, port), ``payload`` (what runs, pickling
checks), ``worker`` (the one rank entry), ``channel`` (events over a pipe), ``capture``
(fd-level output capture), ``supervisor`` (start, watch, stop), ``reporting`` (text / list
reporters), ``run`` (one launch end to end), ``cuda_guard`` (fork safety, NVML), ``ports``,
``errors``. Nothing here imports ``accel_nb.notebook``.

    from accel_nb.launch import make_plan, run_launch, FunctionPayload, TextReporter
    run_launch(FunctionPayload(fn), make_plan(num_processes=2, cpu=True), TextReporter())
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LaunchError": ".errors",
    "RankFailure": ".errors",
    "PayloadError": ".errors",
    "LaunchSetupError": ".errors",
    "LaunchPlan": ".plan",
    "make_plan": ".plan",
    "FunctionPayload": ".payload",
    "CellPayload": ".payload",
    "check_picklable": ".payload",
    "run_launch": ".run",
    "TextReporter": ".reporting",
    "ListReporter": ".reporting",
    "pick_free_port": ".ports",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_nb.launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
