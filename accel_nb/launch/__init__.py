"""Launching a function or a cell on N processes: options -> plan -> start -> supervise -> collect -> clean up.

Shared plumbing, here: ``options`` (what the user asked, checked once), ``plan`` (processes,
start method, port, the launch kind), ``launcher`` (the ``Launcher`` interface: one class per
launch kind, ``ProcessLauncher`` for rank processes; XLA's is in ``xla/``), ``payload`` (what runs;
pickling checks for spawn), ``channel`` (events over a pipe), ``errors``, ``failures`` (the failure
model: a ``FailureKind``, its words, who failed first), ``ports``, ``pythonpath``, ``cuda_guard``
(fork safety), ``zygote`` (the spawn server: a clean interpreter that forks spawned ranks),
``preimport`` (imports a rank's first DDP step needs, once per kernel).

By side and job, sub-packages:

- ``rank/`` runs inside a rank: ``worker`` (the one rank entry), ``capture`` (fd-level output
  capture), ``tqdm_bridge``.
- ``parent/`` runs in the launching process: ``start`` (fork, spawn server, fresh interpreters: one
  ``RankProcess`` interface), ``supervisor`` (watch, stop, stacks on hang or interrupt),
  ``hang_blame``, ``run`` (one launch end to end), ``reporting`` (text / list reporters),
  ``launch_progress``, ``output_lines``, ``metric_history``.
- ``session/`` interactive sessions: ``warm_session``, ``cell_supervisor``, ``loop`` (rank side).
- ``elastic/`` several machines: ``rendezvous``, ``multinode``, ``agent_failures``.
- ``xla/`` XLA devices: ``launcher`` (``XlaLauncher``: the host process), ``ordinal`` (rank side).

Nothing here imports ``accel_nb.notebook``.

    from accel_nb.launch import LaunchOptions, make_plan, run_launch, FunctionPayload, TextReporter
    run_launch(FunctionPayload(fn), make_plan(LaunchOptions(num_processes=2, cpu=True)), TextReporter())
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_EXPORTS = {
    "LaunchError": ".errors",
    "RankFailure": ".errors",
    "FailureKind": ".failures",
    "PayloadError": ".errors",
    "LaunchSetupError": ".errors",
    "LaunchOptions": ".options",
    "LaunchPlan": ".plan",
    "make_plan": ".plan",
    "FunctionPayload": ".payload",
    "CellPayload": ".payload",
    "check_picklable": ".payload",
    "run_launch": ".parent.run",
    "TextReporter": ".parent.reporting",
    "ListReporter": ".parent.reporting",
    "pick_free_port": ".ports",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
