"""Plan a launch before anything starts: how many processes, on what, how started, which port.

plan = make_plan(LaunchOptions(num_processes=2, cpu=True))
plan.headline()            # "Launching 2 CPU processes (gloo) with fork..."
plan.rank_env(1)           # RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, MASTER_PORT=..., ...

``LaunchPlan`` (the decisions) lives in ``launcher.py`` beside the ``Launcher`` interface that reads it.
"""

from __future__ import annotations

import sys

from .. import hardware
from ..precision.setting import bf16_gpu_problem
from . import cuda_guard
from .errors import LaunchSetupError
from .launcher import Launcher, LaunchPlan
from .options import LaunchOptions
from .parent.process_launcher import ProcessLauncher
from .ports import ensure_port_free, pick_free_port


def _check_bf16_hardware(num_gpus: int) -> None:
    """bf16 on a GPU needs compute capability 8.0: say which GPU lacks it, before anything starts."""
    problem = bf16_gpu_problem(hardware.gpu_info()[:num_gpus])
    if problem:
        raise LaunchSetupError(
            f"mixed_precision='bf16' cannot run here: {problem}. Use mixed_precision='fp16' or 'no'"
        )


# how each face spells the choices a refusal names (the notebook's keyword arguments by default)
NOTEBOOK_CHOICES = {"one": "num_processes={n}", "cpu": "cpu=True"}
MAGIC_CHOICES = {"one": "-n {n}", "cpu": "--cpu"}
CLI_CHOICES = {"one": "--num_processes {n}", "cpu": "--cpu"}


def check_one_gpu_per_rank(processes: int, gpus: int, choices: dict[str, str] = NOTEBOOK_CHOICES) -> None:
    """Refuse, before anything starts, a GPU launch of more ranks on this machine than it has GPUs.

    Each GPU rank takes its own device (``LOCAL_RANK``); NCCL refuses two ranks on one GPU ("Duplicate
    GPU detected") only inside every rank's DDP constructor, after the launch has started.

        check_one_gpu_per_rank(2, 1)   # LaunchSetupError: 2 GPU processes asked, 1 GPU here; ...
    """
    if gpus <= 0 or processes <= gpus:
        return
    one = choices["one"].format(n=gpus)
    raise LaunchSetupError(
        f"{processes} GPU processes asked, but this machine has {gpus} GPU{'s' if gpus != 1 else ''} and each "
        f"GPU process needs a GPU of its own (NCCL refuses two ranks on one GPU). Use {one} (one process per "
        f"GPU), {choices['cpu']} to run {processes} CPU processes (gloo) instead, or a machine with "
        f"{processes} GPUs"
    )


def check_gpu_processes(options: LaunchOptions, choices: dict[str, str] = NOTEBOOK_CHOICES) -> None:
    """``check_one_gpu_per_rank`` for ``options`` on this machine (a face calls it first to name its own flags).

    Example:
        check_gpu_processes(options, MAGIC_CHOICES)   # "-n 1", "--cpu" in the refusal
    """
    if options.cpu or options.num_processes is None:
        return
    check_one_gpu_per_rank(options.num_processes, hardware.cuda_device_count(), choices)


def make_plan(options: LaunchOptions) -> LaunchPlan:
    """Decide the launch from checked ``options``; ``LaunchSetupError`` for anything that would fail on every rank.

    plan = make_plan(LaunchOptions(num_processes=2, cpu=True))
    """
    from .xla.launcher import XlaLauncher, choose_xla  # deferred: import time (most launches are not XLA)

    xla = choose_xla(options)
    if xla is not None:  # TPU cores or XLA's CPU devices: one spawned host process runs torch_xla.launch
        return LaunchPlan(options, xla.num_devices, False, "spawn", None, 0, launcher=XlaLauncher(xla))
    gpus = 0 if options.cpu else hardware.cuda_device_count()
    num_processes = options.num_processes
    if num_processes is None:
        num_processes = gpus if gpus > 0 else 1
    use_gpu = gpus > 0
    check_one_gpu_per_rank(num_processes, gpus)
    if options.mixed_precision == "bf16" and use_gpu:
        _check_bf16_hardware(min(num_processes, gpus))

    unsafe = cuda_guard.fork_unsafe_reason()
    spawn_reason = None
    if options.start_method == "auto":
        method = "spawn" if unsafe else "fork"
        spawn_reason = unsafe
    elif options.start_method == "fork" and unsafe:
        raise LaunchSetupError(
            f"start_method='fork' is unsafe here: {unsafe}. Use start_method='spawn' (or 'auto'), or restart "
            "the kernel and launch before touching CUDA"
        )
    else:
        method = options.start_method

    launcher: Launcher = ProcessLauncher()
    if options.num_nodes > 1:  # this machine's share of a job of several machines
        from .elastic.multinode import MultiNodeLauncher, plan_seat  # deferred: import time

        seat = plan_seat(options, num_processes)
        launcher = MultiNodeLauncher(seat)
        port = seat.port
    elif options.use_port is None:
        port = pick_free_port(options.master_addr)
    else:
        port = options.use_port
        ensure_port_free(options.master_addr, port)
    fork_threads = None
    if method == "fork" and "torch" in sys.modules:
        from .rank.worker import native_threads_running

        if native_threads_running():
            fork_threads = 1
    return LaunchPlan(
        options=options,
        fork_threads=fork_threads,
        num_processes=num_processes,
        use_gpu=use_gpu,
        start_method=method,
        spawn_reason=spawn_reason,
        master_port=port,
        launcher=launcher,
    )
