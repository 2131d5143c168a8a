"""``accel-nb launch``: run a script on N processes through torch.distributed's elastic agent (torchrun).

The saved config's values apply where a flag is absent; a rank's failure is summarised in one
line per rank (first to fail first), and the exit code is that rank's. With ``--timeout`` a hang
shows every rank's Python stack and who waits for whom (``accel_nb.launch.elastic.watchdog``).

    accel-nb launch --num_processes 2 train.py --epochs 3

It takes every flag of the reference's ``accelerate launch`` (``accel_nb.commands.launch_flags``: those accel_nb
does not run are refused with the reason), and code written for the reference's internals runs on
``launch_command_parser``, ``_validate_launch_command`` and ``launch_command``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import (
    LAUNCHER_RDZV_BACKENDS,
    MIXED_PRECISION_CHOICES,
    ConfigError,
    LaunchConfig,
    default_config,
    load_config,
)
from ..config.arguments import positive_seconds
from ..config.command_line import PROG
from ..env_names import ENV_LAUNCH_TIMEOUT
from ..hardware import detect
from ..launch.elastic.agent_failures import failure_summary, order_failures
from ..launch.elastic.rendezvous import (
    agent_arguments,
    check_endpoint,
    gloo_interface_env,
    machine_label_template,
    main_endpoint,
    rendezvous_failure,
)
from ..launch.errors import LaunchSetupError, signal_name
from ..launch.plan import CLI_CHOICES, check_one_gpu_per_rank
from .launch_flags import (
    UNBUILT,
    UnderscoreHelpFormatter,
    add_deepspeed_flags,
    add_parallelism_flags,
    add_reference_flags,
    deepspeed_changes,
    parallelism_changes,
    reference_changes,
    refuse_unbuilt,
    track_given,
    validate_launch_args,
)

if TYPE_CHECKING:
    from ..launch.elastic.watchdog import HangWatchdog

__all__ = [
    "add_parser",
    "run",
    "launch_command",
    "launch_command_parser",
    "add_deepspeed_flags",
    "add_parallelism_flags",
    "config_for_launch",
    "torchrun_arguments",
    "rank_environment",
    "agent_environment",
    "run_elastic",
]


_DESCRIPTION = (
    "Run SCRIPT on N processes. Flags override the saved config (accel-nb config). Every flag takes hyphens "
    "or underscores: --num-processes 2 is --num_processes 2."
)


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``launch`` parser: the ``accel-nb launch`` subcommand of ``subparsers``, else a parser of its own.

    It takes the reference's flags too (``accel_nb.commands.launch_flags``): the ones accel_nb runs are in
    ``--help``; the others are refused when given. ``ns.nondefault`` names the flags given on the command line.
    """
    kwargs = {"description": _DESCRIPTION, "allow_abbrev": False, "formatter_class": UnderscoreHelpFormatter}
    if subparsers is not None:
        launch = subparsers.add_parser(
            "launch",
            help="run a script on several processes through torch.distributed's elastic agent",
            **kwargs,
        )
    else:
        launch = argparse.ArgumentParser(f"{PROG} launch", **kwargs)
    track_given(launch)
    launch.add_argument(
        "--config_file", "--config-file", default=None, help="config to read (default: saved one)"
    )
    launch.add_argument(
        "--num_processes", "--num-processes", type=int, default=None, help="all machines together"
    )
    launch.add_argument("--num_machines", "--num-machines", type=int, default=None)
    launch.add_argument("--machine_rank", "--machine-rank", type=int, default=None)
    launch.add_argument("--main_process_ip", "--main-process-ip", default=None)
    launch.add_argument("--main_process_port", "--main-process-port", type=int, default=None)
    launch.add_argument(
        "--rdzv_backend",
        "--rdzv-backend",
        choices=LAUNCHER_RDZV_BACKENDS,
        default=None,
        help="how the machines meet at main_process_ip:main_process_port (default: the config's, static)",
    )
    launch.add_argument(
        "--rdzv_timeout",
        "--rdzv-timeout",
        type=positive_seconds,
        default=None,
        help="seconds to wait for every machine to join before giving up (default: 600)",
    )
    launch.add_argument(
        "--mixed_precision", "--mixed-precision", choices=MIXED_PRECISION_CHOICES, default=None
    )
    launch.add_argument(
        "--gradient_accumulation_steps", "--gradient-accumulation-steps", type=int, default=None
    )
    launch.add_argument("--gpu_ids", "--gpu-ids", default=None, help="'all' or e.g. 0,1")
    launch.add_argument("--cpu", action="store_true", help="run on CPU processes even when GPUs are present")
    launch.add_argument("--max_restarts", "--max-restarts", type=int, default=None)
    add_deepspeed_flags(launch)
    add_parallelism_flags(launch)
    add_reference_flags(launch)
    launch.add_argument(
        "--monitor_interval",
        "--monitor-interval",
        type=positive_seconds,
        default=None,
        help="seconds between the elastic agent's checks of the ranks (torchrun's monitor interval; 0.1)",
    )
    launch.add_argument(
        "--log_line_prefix_template",
        "--log-line-prefix-template",
        default=None,
        help="prefix of each rank's output lines, e.g. '[${rank}]:' (torchrun's; placeholders ${rank}, "
        "${local_rank}, ${role_name})",
    )
    launch.add_argument("--log_dir", "--log-dir", default=None, help="keep per-rank logs here")
    launch.add_argument(
        "--timeout",
        type=positive_seconds,
        default=None,
        help="seconds without output from any rank before the launch is a hang: every rank's Python stack "
        "is shown, then the ranks are stopped, exit code 124 (default: ACCEL_NB_LAUNCH_TIMEOUT, else none)",
    )
    launch.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name (python -m)")
    launch.add_argument("training_script", metavar="script", help="the training script (or module with -m)")
    launch.add_argument(
        "training_script_args",
        metavar="script_args",
        nargs=argparse.REMAINDER,
        help="arguments passed on to the script",
    )
    return launch


def add_parser(sub: Any) -> None:
    """The ``launch`` subcommand of the ``accel-nb`` parser (torchrun's flags, the config's names)."""
    launch_command_parser(sub)


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """The reference's name for :func:`accel_nb.commands.launch_flags.validate_launch_args` (``args`` completed
    from the config file; returns ``(args, config, mixed_precision_from_config)``)."""
    return validate_launch_args(args)


def launch_command(args: argparse.Namespace) -> None:
    """Run the launch ``args`` describe (parsed by :func:`launch_command_parser`), as ``accel-nb launch`` does.

    Raises what the reference raises: ``ValueError`` for contradicting flags or a config file with unknown keys
    (``ConfigError`` is one), ``subprocess.CalledProcessError`` when the launch fails (its exit code).
    """
    as_given = argparse.Namespace(**vars(args))
    _, defaults, _ = validate_launch_args(args)
    refuse_unbuilt(as_given)
    if getattr(args, "mpirun_hostfile", None):  # from the config's mpirun_config
        raise ConfigError(
            "mpirun_config", args.mpirun_hostfile, "no mpirun_config", None, UNBUILT["mpirun_hostfile"]
        )
    saved = dict(os.environ)
    try:
        code = run(as_given)
    finally:  # run() sets the ranks' variables in this process's environment: take them back
        os.environ.clear()
        os.environ.update(saved)
    if code != 0:
        raise subprocess.CalledProcessError(
            code, [PROG, "launch", args.training_script, *args.training_script_args]
        )


def config_for_launch(ns: argparse.Namespace) -> LaunchConfig:
    """The saved (or default) config with the command-line flags applied, validated."""
    if ns.config_file and not os.path.exists(ns.config_file):
        raise ConfigError("--config_file", ns.config_file, "an existing config file", None, "no such file")
    cfg = load_config(ns.config_file) or default_config()
    changes = {
        "num_processes": ns.num_processes,
        "num_machines": ns.num_machines,
        "machine_rank": ns.machine_rank,
        "main_process_ip": ns.main_process_ip,
        "main_process_port": ns.main_process_port,
        "mixed_precision": ns.mixed_precision,
        "gradient_accumulation_steps": ns.gradient_accumulation_steps,
        "gpu_ids": ns.gpu_ids,
        "max_restarts": ns.max_restarts,
        "rdzv_backend": ns.rdzv_backend,
    }
    if ns.cpu:
        changes["use_cpu"] = True
    deepspeed_changes(ns, cfg, changes)
    reference_changes(ns, cfg, changes)
    parallelism_changes(ns, cfg)
    try:
        return cfg.replace(**changes)
    except ConfigError as exc:
        flag = f"--{exc.key}" if changes.get(exc.key) is not None else exc.key
        raise ConfigError(flag, exc.value, exc.allowed, exc.path, getattr(exc, "reason", "")) from None


def torchrun_arguments(
    cfg: LaunchConfig,
    nproc: int,
    script: str,
    script_args: list[str],
    log_dir: str,
    module: bool = False,
    monitor_interval: float | None = None,
    endpoint: tuple[str, int] | None = None,
    rdzv_timeout: float | None = None,
    stacks_dir: str | None = None,
) -> list[str]:
    """The argument list for ``torch.distributed.run`` that runs ``script`` as ``cfg`` says.

    ``endpoint`` is where the machines meet (default: :func:`accel_nb.launch.elastic.rendezvous.main_endpoint`).
    With ``stacks_dir`` each rank runs the script through accel_nb's rank file that answers the hang
    watchdog's request for stacks (``accel_nb.launch.elastic.watchdog``).
    """
    addr, port = endpoint or main_endpoint(cfg)
    args = agent_arguments(
        cfg.num_machines,
        cfg.machine_rank,
        nproc,
        cfg.rdzv_backend,
        addr,
        port,
        rdzv_timeout,
        cfg.max_restarts,
    )
    args += ["--log_dir", log_dir, "--tee", "3"]
    if monitor_interval is not None:
        args += ["--monitor_interval", str(monitor_interval)]
    if stacks_dir is not None:
        from ..launch.elastic.watchdog import wrapped_command  # deferred: import time (only with a timeout)

        return args + wrapped_command(script, list(script_args), module, stacks_dir)
    if module:
        args.append("--module")
    return args + [script] + list(script_args)


def run(ns: argparse.Namespace) -> int:
    """``accel-nb launch``: check the config against this machine, then run the agent; the exit code."""
    refuse_unbuilt(ns)
    cfg = config_for_launch(ns)
    hw = detect()
    if not cfg.use_cpu and cfg.distributed_type != "MULTI_CPU":  # a GPU launch: one GPU per process, first
        gpus = hw.num_gpus if cfg.gpu_ids == "all" else min(hw.num_gpus, len(cfg.gpu_ids.split(",")))
        try:
            check_one_gpu_per_rank(cfg.processes_here(hw), gpus, CLI_CHOICES)
        except LaunchSetupError as exc:
            from_file = ns.num_processes is None and cfg.source
            source = f" (num_processes={cfg.num_processes} is from {cfg.source})" if from_file else ""
            print(f"{PROG} launch: error: {exc}{source}", file=sys.stderr)
            return 2
    for note in cfg.check_hardware(hw):
        print(f"{PROG} launch: note: {note}", file=sys.stderr)
    if getattr(ns, "quiet", False):  # the reference's flag: taken, and said once that it changes nothing
        print(
            f"{PROG} launch: note: --quiet changes nothing here: a failed launch is already summarised "
            "(the first rank to fail, its traceback, where every rank's full log is)",
            file=sys.stderr,
        )
    if not ns.module and not os.path.isfile(ns.training_script):
        print(
            f"{PROG} launch: error: script {ns.training_script!r} not found (from {os.getcwd()})",
            file=sys.stderr,
        )
        return 2
    try:
        timeout = _timeout(ns)
    except ValueError as exc:
        print(f"{PROG} launch: error: {exc}", file=sys.stderr)
        return 2
    endpoint = main_endpoint(cfg)
    check_endpoint(cfg, *endpoint)
    nproc = cfg.processes_here(hw)
    own_log_dir = ns.log_dir is None
    log_dir = ns.log_dir or tempfile.mkdtemp(prefix="accel_nb_launch_")
    watchdog = None
    if timeout is not None:
        from ..launch.elastic.watchdog import HangWatchdog  # deferred: import time (only with a timeout)

        os.makedirs(log_dir, exist_ok=True)
        watchdog = HangWatchdog(timeout, log_dir, tempfile.mkdtemp(prefix="stacks_", dir=log_dir), nproc)
    device = "CPU" if cfg.use_cpu or not hw.num_gpus else "GPU"
    os.environ.update(rank_environment(cfg, endpoint[0], device, ns.log_line_prefix_template))
    # breakpoint() in a rank: pdb on this terminal, named after the rank, one rank at a time (deferred
    # import: it imports pdb, which the launch itself never needs)
    from ..launch.rank.terminal_pdb import HOOK, lock_path

    os.environ.setdefault("PYTHONBREAKPOINT", HOOK)
    if getattr(ns, "num_cpu_threads_per_process", None) is not None:
        os.environ["OMP_NUM_THREADS"] = str(ns.num_cpu_threads_per_process)
    if getattr(ns, "debug", False):
        os.environ["ACCELERATE_DEBUG_MODE"] = "true"  # read by code written for the reference
    args = torchrun_arguments(
        cfg,
        nproc,
        ns.training_script,
        ns.training_script_args,
        log_dir,
        ns.module,
        ns.monitor_interval,
        endpoint,
        ns.rdzv_timeout,
        watchdog.stacks_dir if watchdog is not None else None,
    )
    print(
        f"{PROG} launch: {nproc} {device} process(es) on this machine"
        + (
            f" (machine {cfg.machine_rank} of {cfg.num_machines}, meeting at {endpoint[0]}:{endpoint[1]}, "
            f"{cfg.rdzv_backend} rendezvous)"
            if cfg.num_machines > 1
            else ""
        )
        + f", mixed_precision={cfg.mixed_precision}"
        + (f", torch.compile backend={cfg.dynamo_backend}" if cfg.dynamo_backend != "no" else "")
        + (f", hang timeout {timeout:g} s" if timeout is not None else ""),
        file=sys.stderr,
        flush=True,
    )
    code = run_elastic(
        args,
        ns.training_script,
        log_dir,
        lambda exc: rendezvous_failure(exc, cfg.num_machines, cfg.machine_rank, *endpoint, ns.rdzv_timeout),
        watchdog,
    )
    with contextlib.suppress(OSError):  # the ranks' pdb lock, left when a rank stopped at a breakpoint
        os.remove(lock_path(os.getpid()))
    if code == 0 and own_log_dir:
        shutil.rmtree(log_dir, ignore_errors=True)
    return code


def _timeout(ns: argparse.Namespace) -> float | None:
    """``--timeout``, else ``ACCEL_NB_LAUNCH_TIMEOUT``; None: no hang watchdog."""
    flag = getattr(ns, "timeout", None)
    if flag is None and not os.environ.get(ENV_LAUNCH_TIMEOUT, "").strip():
        return None
    from ..launch.elastic.watchdog import launch_timeout  # deferred: import time (only with a timeout)

    return launch_timeout(flag)


def rank_environment(
    cfg: LaunchConfig, main_ip: str, device: str, template: str | None = None
) -> dict[str, str]:
    """What ``accel-nb launch`` adds to the environment of the agent and its ranks: the config's values and
    :func:`agent_environment`'s (``prepare_multi_gpu_env`` in accel_nb.commands.launch_env returns the same)."""
    return {**cfg.to_env(), **agent_environment(cfg, main_ip, device, template)}


def agent_environment(cfg: LaunchConfig, main_ip: str, device: str, template: str | None) -> dict[str, str]:
    """What the agent and its ranks need in the environment beyond the config's values.

    torchrun reads the log-line prefix template from the environment only; across machines it
    defaults to one naming the machine and the rank, and gloo gets the interface that reaches
    machine 0 unless ``GLOO_SOCKET_IFNAME`` is already set.
    """
    env: dict[str, str] = {}
    if template is None and cfg.num_machines > 1:
        template = machine_label_template(cfg.machine_rank)
    if template is not None:
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = template
    if cfg.num_machines > 1 and device == "CPU":
        env.update(gloo_interface_env(main_ip))
    return env


class _DropFailureLine:
    """Logging filter: torch's own "failed (exitcode ...)" line is replaced by our summary; once the hang
    watchdog has fired, the agent's lines about the SIGTERM it sent are too (the report says it)."""

    def __init__(self, watchdog: HangWatchdog | None = None) -> None:
        self.watchdog = watchdog

    def filter(self, record: Any) -> bool:
        if self.watchdog is not None and self.watchdog.fired:
            return False
        return not str(record.getMessage()).startswith("failed (exitcode")


def run_elastic(
    args: list[str],
    script: str,
    log_dir: str,
    explain: Callable[[BaseException], str | None] | None = None,
    watchdog: HangWatchdog | None = None,
) -> int:
    """Run torch.distributed's elastic agent in this process; a readable summary when a rank fails.

    ``explain`` turns an error of the agent itself (a rendezvous that never completed) into one line.
    ``watchdog`` (a ``HangWatchdog``) watches the ranks while the agent runs; when it fires, its
    report is printed and the exit code is its ``exit_code`` (124).
    """
    # deferred: import time (torch and its elastic agent only when a launch runs)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    loggers = [
        logging.getLogger(f"torch.distributed.elastic.{name}.api")
        for name in ("multiprocessing", "agent.server")
    ]
    drop = _DropFailureLine(watchdog)
    for logger in loggers:
        logger.addFilter(drop)

    def hung() -> bool:  # the watchdog fired (its SIGTERM stopped the agent): say what it found
        if watchdog is None or not watchdog.settle():
            return False
        print(f"{PROG} launch: {watchdog.report}", file=sys.stderr, flush=True)
        return True

    try:
        if watchdog is not None:
            watchdog.start()
        run(parse_args(args))
        return watchdog.exit_code if hung() else 0
    except ChildFailedError as exc:
        if hung():
            return watchdog.exit_code
        print(failure_summary(exc.failures, script, log_dir), file=sys.stderr, flush=True)
        first = order_failures(exc.failures, log_dir)[0][1]
        return first.exitcode if first.exitcode > 0 else 128 + (-first.exitcode or 1)
    except (KeyboardInterrupt, SignalException) as exc:
        if hung():
            return watchdog.exit_code
        sig = getattr(exc, "sigval", signal.SIGINT)
        print(
            f"{PROG} launch: stopped by {signal_name(sig)}; every rank was stopped (logs under {log_dir})",
            file=sys.stderr,
        )
        return 128 + int(sig)
    except Exception as exc:  # rendezvous errors and the like: one line, not a traceback
        if hung():
            return watchdog.exit_code
        said = explain(exc) if explain is not None else None
        print(f"{PROG} launch: error: {said or f'{type(exc).__name__}: {exc}'}", file=sys.stderr)
        return 1
    finally:
        if watchdog is not None:
            watchdog.settle()
        for logger in loggers:
            logger.removeFilter(drop)
