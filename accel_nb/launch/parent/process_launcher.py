"""``ProcessLauncher``: the launch kind of N rank processes on this machine (``launch/launcher.py``: the interface).

The ranks get torchrun's environment plus accel_nb's settings, and start forked from the notebook or
spawned (``launch/parent/start.py``), as ``plan.start_method`` says. ``MultiNodeLauncher``
(``launch/elastic/multinode.py``) builds on it for this machine's share of a job of several machines.

    ProcessLauncher().rank_env(plan, 1)    # RANK=1, WORLD_SIZE=..., MASTER_PORT=..., ...
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ...env_names import ENV_FORKED, ENV_USE_CPU, REFERENCE_USE_CPU
from ..launcher import Launcher

if TYPE_CHECKING:
    from ..launcher import LaunchPlan
    from .rank_process import RankProcess


class ProcessLauncher(Launcher):
    """N rank processes on this machine with torchrun's environment: forked, or spawned (``plan.start_method``)."""

    def backend(self, plan: LaunchPlan) -> str:
        return "nccl" if plan.use_gpu else "gloo"

    def headline(self, plan: LaunchPlan) -> str:
        n = plan.num_processes
        what = (
            f"{n} GPU process{'es' if n != 1 else ''} (nccl)"
            if plan.use_gpu
            else f"{n} CPU process{'es' if n != 1 else ''} (gloo)"
        )
        extra = (
            f", mixed_precision={plan.mixed_precision}" if plan.mixed_precision not in (None, "no") else ""
        )
        return f"Launching {what} with {plan.start_method}{extra}..."

    def rank_env(self, plan: LaunchPlan, rank: int) -> dict[str, str]:
        """The torchrun environment of ``rank`` plus accel_nb's own settings."""
        n = str(plan.num_processes)
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": n,
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": n,
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": n,
            "ROLE_NAME": "default",
            "GROUP_WORLD_SIZE": "1",
            "NODE_RANK": "0",
            "MASTER_ADDR": plan.master_addr,
            "MASTER_PORT": str(plan.master_port),
            "TORCHELASTIC_RUN_ID": "accel_nb",
        }
        env.update(plan.training_env())
        if not plan.use_gpu:
            env[ENV_USE_CPU] = "1"
            env[REFERENCE_USE_CPU] = "true"
        if plan.start_method == "fork":
            env[ENV_FORKED] = "1"
        if plan.num_processes > 1 and not plan.use_gpu and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun: N ranks must not each use every core
        env.update(self.extra_env(plan, rank))
        env.update(plan.options.env)
        return env

    def extra_env(self, plan: LaunchPlan, rank: int) -> dict[str, str]:
        """What a kind of process launch adds to (or changes in) the torchrun environment; the user's ``env`` comes after."""
        return {}

    def start(self, plan: LaunchPlan, payload: Any, log_dir: str, procs: list[RankProcess]) -> None:
        from .start import (
            start_ranks,  # deferred: import time (plan is imported by the faces at startup)
        )

        start_ranks(plan, payload, log_dir, procs)
