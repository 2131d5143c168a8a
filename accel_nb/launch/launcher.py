"""How a plan's ranks come to life: one ``Launcher`` per launch kind, held by the plan.

A launcher says what the launch is called (``headline``), which process-group backend its ranks
use, each rank's environment, and starts the ranks into the list the supervisor watches. The rest
of a launch (payload checks, supervision, reporting, clean-up) is the same for every kind.

- ``ProcessLauncher`` (``launch/parent/process_launcher.py``): N rank processes on this machine, forked from the notebook or
  spawned (through the spawn server ``zygote``, or fresh interpreters), as ``plan.start_method`` says.
- ``MultiNodeLauncher`` (``launch/elastic/multinode.py``): the same processes as this machine's
  share of a job of several machines (a rendezvous before, global ranks, leaving after).
- ``XlaLauncher`` (``launch/xla/launcher.py``): one host process that runs ``torch_xla.launch``.

A new launch kind subclasses ``Launcher`` and is chosen in ``make_plan`` (``launch/plan.py``). A
session (``Session``, ``%accelerate start``) starts its ranks through the same ``start``, on the kinds whose
``session_problem`` is None.

    plan.launcher.headline(plan)              # "Launching 2 CPU processes (gloo) with fork..."
    plan.launcher.start(plan, payload, log_dir, procs)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .parent.start import RankProcess
    from .plan import LaunchPlan


class Launcher:
    """One kind of launch: what it is called, each rank's environment, and how its ranks start."""

    def backend(self, plan: LaunchPlan) -> str:
        """The process-group backend the ranks use (shown in the launch details)."""
        raise NotImplementedError

    def headline(self, plan: LaunchPlan) -> str:
        """The line printed before anything starts."""
        raise NotImplementedError

    def rank_env(self, plan: LaunchPlan, rank: int) -> dict[str, str]:
        """The environment ``rank``'s process gets on top of the notebook's."""
        raise NotImplementedError

    def prepare(self, plan: LaunchPlan, say: Callable[[str], None]) -> None:
        """Before the display starts (nothing by default; a multi-machine launch waits for every machine)."""

    def start(self, plan: LaunchPlan, payload: Any, log_dir: str, procs: list[RankProcess]) -> None:
        """Start the rank processes into ``procs`` (filled as they start, so a half-done start can be cleaned up)."""
        raise NotImplementedError

    def release(self, plan: LaunchPlan, ok: bool) -> None:
        """After the ranks are over, whatever the outcome (nothing by default)."""

    def session_problem(self, plan: LaunchPlan) -> str | None:
        """Why this kind cannot hold a session (ranks kept alive between cells), said to the user; None when it can."""
        return None
