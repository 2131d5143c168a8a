"""Plan a launch before anything starts: how many processes, on what, how started, which port.

plan = make_plan(num_processes=2, cpu=True)
plan.headline()            # "Launching 2 CPU processes (gloo), fork start..."
plan.rank_env(1)           # RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, MASTER_PORT=..., ...
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from . import cuda_guard
from .errors import LaunchSetupError
from .ports import ensure_port_free, pick_free_port

START_METHODS = ("auto", "fork", "spawn")


@dataclass
class LaunchPlan:
    """The decisions of the plan step; everything the start step needs."""

    num_processes: int
    use_gpu: bool
    start_method: str  # "fork" or "spawn"
    spawn_reason: str | None  # why "auto" chose spawn (None when it chose fork or the user asked)
    master_addr: str
    master_port: int
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    fork_threads: int | None = None  # torch threads of a forked rank (1 when the notebook's OpenMP pool ran)

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"

    def headline(self) -> str:
        what = (
            f"{self.num_processes} GPU process{'es' if self.num_processes != 1 else ''} (nccl)"
            if self.use_gpu
            else (f"{self.num_processes} CPU process{'es' if self.num_processes != 1 else ''} (gloo)")
        )
        extra = (
            f", mixed_precision={self.mixed_precision}" if self.mixed_precision not in (None, "no") else ""
        )
        return f"Launching {what} with {self.start_method}{extra}..."

    def rank_env(self, rank: int) -> dict[str, str]:
        """The torchrun environment of ``rank`` plus accel_nb's own settings."""
        n = str(self.num_processes)
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
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RUN_ID": "accel_nb",
        }
        if self.mixed_precision is not None:
            env["ACCEL_NB_MIXED_PRECISION"] = self.mixed_precision
            env["ACCELERATE_MIXED_PRECISION"] = self.mixed_precision
        if self.gradient_accumulation_steps is not None:
            env["ACCEL_NB_GRADIENT_ACCUMULATION_STEPS"] = str(self.gradient_accumulation_steps)
            env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(self.gradient_accumulation_steps)
        if not self.use_gpu:
            env["ACCEL_NB_USE_CPU"] = "1"
            env["ACCELERATE_USE_CPU"] = "true"
        if self.start_method == "fork":
            env["ACCEL_NB_FORKED"] = "1"
        if self.num_processes > 1 and not self.use_gpu and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun: N ranks must not each use every core
        env.update(self.extra_env)
        return env


def _validate_precision(mixed_precision: str | None, use_gpu: bool, num_processes: int) -> str | None:
    if mixed_precision is None:
        return None
    value = str(mixed_precision).strip().lower()
    if value not in ("no", "fp16", "bf16", "fp8"):
        raise LaunchSetupError(f"mixed_precision={mixed_precision!r} is not one of 'no', 'fp16', 'bf16'")
    if value == "fp8":
        raise LaunchSetupError("mixed_precision='fp8' is not supported by accel_nb yet; use 'bf16' or 'fp16'")
    if value == "bf16" and use_gpu:
        for index in range(num_processes):
            info = cuda_guard.gpu_info(index)
            if info is None:
                continue
            name, (major, minor) = info
            if major < 8:
                raise LaunchSetupError(
                    f"mixed_precision='bf16' is not supported by GPU {index} ({name}, compute capability "
                    f"{major}.{minor}; bf16 needs 8.0 or newer); use mixed_precision='fp16' or 'no'"
                )
    return value


def make_plan(
    num_processes: int | None = None,
    mixed_precision: str | None = None,
    master_addr: str = "127.0.0.1",
    use_port: int | str | None = None,
    start_method: str = "auto",
    cpu: bool = False,
    gradient_accumulation_steps: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> LaunchPlan:
    """Decide the launch. Raises ``LaunchSetupError`` for anything that would fail on every rank."""
    if start_method not in START_METHODS:
        raise LaunchSetupError(
            f"start_method={start_method!r} is not one of {', '.join(map(repr, START_METHODS))}"
        )
    gpus = 0 if cpu else cuda_guard.gpu_count()
    if num_processes is None:
        num_processes = gpus if gpus > 0 else 1
    try:
        num_processes = int(num_processes)
    except (TypeError, ValueError):
        raise LaunchSetupError(
            f"num_processes={num_processes!r} must be a whole number of processes"
        ) from None
    if num_processes < 1:
        raise LaunchSetupError(f"num_processes={num_processes} must be at least 1")
    use_gpu = gpus > 0
    precision = _validate_precision(mixed_precision, use_gpu, min(num_processes, max(gpus, 1)))
    if gradient_accumulation_steps is not None and int(gradient_accumulation_steps) < 1:
        raise LaunchSetupError(
            f"gradient_accumulation_steps={gradient_accumulation_steps} must be at least 1"
        )

    unsafe = cuda_guard.fork_unsafe_reason()
    spawn_reason = None
    if start_method == "auto":
        method = "spawn" if unsafe else "fork"
        spawn_reason = unsafe
    elif start_method == "fork" and unsafe:
        raise LaunchSetupError(
            f"start_method='fork' is unsafe here: {unsafe}. Use start_method='spawn' (or 'auto'), or restart "
            "the kernel and launch before touching CUDA"
        )
    else:
        method = start_method

    if use_port is None or use_port == "":
        port = pick_free_port(master_addr)
    else:
        try:
            port = int(use_port)
        except (TypeError, ValueError):
            raise LaunchSetupError(f"use_port={use_port!r} is not a port number") from None
        ensure_port_free(master_addr, port)
    fork_threads = None
    if method == "fork" and "torch" in sys.modules:
        from .worker import native_threads_running

        if native_threads_running():
            fork_threads = 1
    return LaunchPlan(
        fork_threads=fork_threads,
        num_processes=num_processes,
        use_gpu=use_gpu,
        start_method=method,
        spawn_reason=spawn_reason,
        master_addr=master_addr,
        master_port=port,
        mixed_precision=precision,
        gradient_accumulation_steps=None
        if gradient_accumulation_steps is None
        else int(gradient_accumulation_steps),
        extra_env=dict(extra_env or {}),
    )
