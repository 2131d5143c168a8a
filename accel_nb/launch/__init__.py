"""Launching a function or a cell on N processes: options -> plan -> start -> supervise -> collect -> clean up.

Modules, one job each: ``options`` (what the user asked, checked once), ``plan`` (processes,
start method, port), ``payload`` (what runs; pickling checks for spawn), ``start`` (fork, the
warm spawn server ``zygote``, fresh interpreters: one ``RankProcess`` interface), ``worker``
(the one rank entry), ``channel`` (events over a pipe), ``capture`` (fd-level output capture),
``supervisor`` (watch, stop, stacks on hang or interrupt), ``reporting`` (text / list
reporters), ``run`` (one launch end to end), ``warm`` (imports a rank's first DDP step needs,
once per kernel), ``cuda_guard`` (fork safety), ``ports``, ``pythonpath``, ``errors``. Nothing
here imports ``accel_nb.notebook``.

    from accel_nb.launch import LaunchOptions, make_plan, run_launch, FunctionPayload, TextReporter
    run_launch(FunctionPayload(fn), make_plan(LaunchOptions(num_processes=2, cpu=True)), TextReporter())
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_EXPORTS = {
    "LaunchError": ".errors",
    "RankFailure": ".errors",
    "PayloadError": ".errors",
    "LaunchSetupError": ".errors",
    "LaunchOptions": ".options",
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


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
