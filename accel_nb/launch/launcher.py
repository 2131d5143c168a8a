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

``LaunchPlan``, the plan's decisions that every launcher reads, is here too (the plan holds its
launcher, the launcher's methods take the plan); ``make_plan`` (``launch/plan.py``) makes one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..env_names import ENV_GRADIENT_ACCUMULATION_STEPS, ENV_MIXED_PRECISION, REFERENCE_NAMES
from .options import LaunchOptions

if TYPE_CHECKING:
    from .parent.rank_process import RankProcess


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


@dataclass
class LaunchPlan:
    """The decisions of the plan step; everything the start step needs (``options``: what the user asked)."""

    options: LaunchOptions
    num_processes: int
    use_gpu: bool
    start_method: str  # "fork" or "spawn"
    spawn_reason: str | None  # why "auto" chose spawn (None when it chose fork or the user asked)
    master_port: int
    fork_threads: int | None = None  # torch threads of a forked rank (1 when the notebook's OpenMP pool ran)
    # the launch kind: how the ranks start (make_plan chooses it: ProcessLauncher, MultiNodeLauncher, XlaLauncher)
    launcher: Launcher = field(kw_only=True)

    @property
    def master_addr(self) -> str:
        return self.options.master_addr

    @property
    def mixed_precision(self) -> str | None:
        return self.options.mixed_precision

    @property
    def gradient_accumulation_steps(self) -> int | None:
        return self.options.gradient_accumulation_steps

    @property
    def backend(self) -> str:
        return self.launcher.backend(self)

    def headline(self) -> str:
        return self.launcher.headline(self)

    def training_env(self) -> dict[str, str]:
        """The launch's training settings as the environment every rank's Accelerator reads (both names)."""
        env = {}
        if self.mixed_precision is not None:
            env[ENV_MIXED_PRECISION] = self.mixed_precision
            env[REFERENCE_NAMES[ENV_MIXED_PRECISION]] = self.mixed_precision
        if self.gradient_accumulation_steps is not None:
            env[ENV_GRADIENT_ACCUMULATION_STEPS] = str(self.gradient_accumulation_steps)
            env[REFERENCE_NAMES[ENV_GRADIENT_ACCUMULATION_STEPS]] = str(self.gradient_accumulation_steps)
        return env

    def rank_env(self, rank: int) -> dict[str, str]:
        """The environment of ``rank``'s process (the launcher's: torchrun's variables for rank processes)."""
        return self.launcher.rank_env(self, rank)
