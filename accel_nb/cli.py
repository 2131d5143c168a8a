"""The ``accel-nb`` command: ``config`` (questions), ``config default``, ``env`` and ``launch``.

    accel-nb config default                  # write a config for this machine, no questions
    accel-nb env                             # the report to paste into a bug report
    accel-nb launch --num_processes 2 train.py --epochs 3

``launch`` runs the script through torch.distributed's elastic agent (what ``torchrun`` runs),
with the saved config's values where a flag is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from .config import (
    DYNAMO_BACKENDS,
    MIXED_PRECISIONS,
    START_METHODS,
    ConfigError,
    LaunchConfig,
    default_config,
    derive_distributed_type,
    load_config,
    save_config,
)
from .launch.elastic.failures import failure_summary, order_failures
from .launch.errors import signal_name

PROG = "accel-nb"


# ------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Configure and launch accel_nb training.")
    sub = parser.add_subparsers(dest="command", metavar="{config,env,launch}")

    cfg = sub.add_parser("config", help="answer a few questions and save the launch config")
    cfg.add_argument(
        "--config_file", "--config-file", default=None, help="where to save (default: %(default)s)"
    )
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="{default}")
    dflt = cfg_sub.add_parser("default", help="save a config for this machine without questions")
    dflt.add_argument("--config_file", "--config-file", default=None, dest="config_file_default")
    dflt.add_argument("--mixed_precision", "--mixed-precision", choices=MIXED_PRECISIONS, default=None)

    env = sub.add_parser("env", help="print versions, hardware and the launch config (for bug reports)")
    env.add_argument("--config_file", "--config-file", default=None)

    launch = sub.add_parser(
        "launch",
        help="run a script on several processes through torch.distributed's elastic agent",
        description="Run SCRIPT on N processes. Flags override the saved config (accel-nb config).",
    )
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
        "--rdzv_backend", "--rdzv-backend", choices=("static", "c10d"), default=None,
        help="how the machines meet at main_process_ip:main_process_port (default: the config's, static)",
    )  # fmt: skip
    launch.add_argument(
        "--rdzv_timeout", "--rdzv-timeout", type=positive_seconds, default=None,
        help="seconds to wait for every machine to join before giving up (default: 600)",
    )  # fmt: skip
    launch.add_argument("--mixed_precision", "--mixed-precision", choices=MIXED_PRECISIONS, default=None)
    launch.add_argument(
        "--gradient_accumulation_steps", "--gradient-accumulation-steps", type=int, default=None
    )
    launch.add_argument("--gpu_ids", "--gpu-ids", default=None, help="'all' or e.g. 0,1")
    launch.add_argument("--cpu", action="store_true", help="run on CPU processes even when GPUs are present")
    launch.add_argument("--max_restarts", "--max-restarts", type=int, default=None)
    add_deepspeed_flags(launch)
    launch.add_argument(
        "--monitor_interval", "--monitor-interval", type=positive_seconds, default=None,
        help="seconds between the elastic agent's checks of the ranks (torchrun's --monitor-interval; 0.1)",
    )  # fmt: skip
    launch.add_argument(
        "--log_line_prefix_template", "--log-line-prefix-template", default=None,
        help="prefix of each rank's output lines, e.g. '[${rank}]:' (torchrun's; placeholders ${rank}, "
        "${local_rank}, ${role_name})",
    )  # fmt: skip
    launch.add_argument("--log_dir", "--log-dir", default=None, help="keep per-rank logs here")
    launch.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name (python -m)")
    launch.add_argument("script", help="the training script (or module with -m)")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed on to the script")
    return parser


def positive_seconds(text: str) -> float:
    """argparse type for a duration: a number of seconds above 0 (``"0.5"`` -> 0.5)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``accel-nb`` and ``python -m accel_nb.cli``; returns the exit code."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command == "config":
            if ns.config_command == "default":
                return cmd_config_default(ns.config_file_default or ns.config_file, ns.mixed_precision)
            return cmd_config_questions(ns.config_file)
        if ns.command == "env":
            return cmd_env(ns.config_file)
        if ns.command == "launch":
            return cmd_launch(ns)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 1


# ------------------------------------------------------------------------------------ config / env


def cmd_config_default(path: str | None, mixed_precision: str | None = None) -> int:
    cfg = default_config()
    if mixed_precision:
        cfg = cfg.replace(mixed_precision=mixed_precision)
    written = save_config(cfg, path)
    print(f"accel_nb config written to {written}")
    print(f"  {describe(cfg)}")
    return 0


def cmd_env(path: str | None) -> int:
    from .env_report import environment_report

    print(environment_report(config_path=path))
    return 0


def describe(cfg: LaunchConfig) -> str:
    """One line: what a launch with this config does."""
    where = "CPU" if cfg.use_cpu or cfg.distributed_type == "MULTI_CPU" else cfg.distributed_type
    n = "every GPU (else 1)" if cfg.num_processes is None else str(cfg.num_processes)
    return (
        f"distributed_type={cfg.distributed_type}, num_processes={n} on {cfg.num_machines} machine(s), "
        f"mixed_precision={cfg.mixed_precision}, gradient_accumulation_steps={cfg.gradient_accumulation_steps}"
        + (" (CPU)" if where == "CPU" else "")
    )


class _Aborted(Exception):
    pass


def _ask(prompt: str, default: Any, parse: Callable[[str], Any], out: Any) -> Any:
    """Ask until ``parse`` accepts the answer; an empty answer means the default (parsed the same way)."""
    shown = (
        "yes" if default is True else "no" if default is False else "" if default is None else str(default)
    )
    while True:
        try:
            raw = input(f"{prompt} [{shown}]: ")
        except EOFError:
            raise _Aborted from None
        try:
            return parse(raw.strip() or shown)
        except (ConfigError, ValueError) as exc:
            print(f"  ! {exc}", file=out, flush=True)


def _checked(cfg: LaunchConfig, compute: str, **change: Any) -> LaunchConfig:
    """``cfg`` with ``change`` applied and validated; a ConfigError about that key propagates."""
    new = dataclasses.replace(cfg, **change)
    new.extras = dict(cfg.extras)
    new.use_cpu = compute == "cpu"
    try:
        new.validate()  # normalises the answer's type (e.g. "2" -> 2)
    except ConfigError as exc:
        if exc.key in change:
            raise
    new.distributed_type = derive_distributed_type(new, compute)
    try:
        return new.validate()
    except ConfigError as exc:
        if exc.key in change or (exc.key == "distributed_type" and "num_processes" in change):
            raise
        return new  # a consistency problem with a later answer: checked again at the end


def _one_of(options: tuple[str, ...] | list[str], key: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in [o.lower() for o in options]:
            raise ConfigError(key, raw, ", ".join(options))
        return value

    return parse


def _yes_no(key: str) -> Callable[[str], bool]:
    def parse(raw: str) -> bool:
        value = raw.strip().lower()
        if value in ("y", "yes", "true", "1"):
            return True
        if value in ("n", "no", "false", "0"):
            return False
        raise ConfigError(key, raw, "yes or no")

    return parse


def questionnaire(path: str | None = None, out: Any = None) -> LaunchConfig:
    """Ask for each setting in the terminal (``input()``), validating every answer; return the config."""
    from .hardware import detect

    out = out or sys.stdout
    hw = detect()
    try:
        base = load_config(path) if path is None or os.path.exists(path) else None
    except ConfigError as exc:
        print(f"The saved config cannot be used ({exc}); starting from this machine's defaults.", file=out)
        base = None
    base = base or default_config(hw)
    print(f"Detected: {hw.cpu_logical_cores} CPU cores, {hw.num_gpus} GPU(s)"
          + (f" ({', '.join(g.name for g in hw.gpus)})" if hw.gpus else "")
          + (f", TPU ({hw.tpu_chips} chips)" if hw.tpu_detected else "")
          + (f"; {hw.xla_runtime.describe()}" if hw.xla_runtime is not None else ""), file=out)  # fmt: skip
    print("Press Enter to keep the value in [brackets].", file=out, flush=True)

    choices = ["cpu"] + (["gpu"] if hw.num_gpus else []) + (["xla"] if hw.xla_available else [])
    current = {"XLA": "xla", "MULTI_GPU": "gpu", "MULTI_CPU": "cpu"}.get(base.distributed_type)
    if current is None:
        current = "cpu" if base.use_cpu or not hw.num_gpus else "gpu"
    if current not in choices:
        current = "gpu" if hw.num_gpus else "cpu"
    compute = _ask(f"Compute on ({'/'.join(choices)})", current, _one_of(choices, "compute"), out)
    cfg = _checked(base, compute)

    def field(key: str, prompt: str, default: Any, convert: Callable[[str], Any] = str) -> None:
        nonlocal cfg
        cfg = _ask(prompt, default, lambda raw: _checked(cfg, compute, **{key: convert(raw)}), out)

    field("num_machines", "How many machines", cfg.num_machines)
    if cfg.num_machines > 1:
        field("machine_rank", "Rank of this machine (0 = the main one)", cfg.machine_rank)
        field("main_process_ip", "IP address or host name of machine 0", cfg.main_process_ip)
        field("main_process_port", "Port on machine 0", cfg.main_process_port or 29500)
        field("rdzv_backend", "Rendezvous backend (static/c10d)", cfg.rdzv_backend)
        field("same_network", "Are all machines on the same network (yes/no)", cfg.same_network,
              _yes_no("same_network"))  # fmt: skip
    else:
        cfg = _checked(cfg, compute, machine_rank=0)
    xla_devices = hw.xla_runtime.num_devices if hw.xla_runtime is not None else 1
    per_machine = {"gpu": max(hw.num_gpus, 1), "cpu": 1, "xla": xla_devices}[compute]
    default_n = cfg.num_processes if cfg.num_processes is not None else per_machine * cfg.num_machines
    if compute == "gpu" and base.use_cpu:
        default_n = per_machine * cfg.num_machines
    field("num_processes", "How many processes in total (all machines)", default_n)
    if compute == "gpu":
        field("gpu_ids", "Which GPUs (all, or ids like 0,1)", cfg.gpu_ids)
    mp_default = "no" if compute == "cpu" and cfg.mixed_precision == "fp16" else cfg.mixed_precision
    field("mixed_precision", f"Mixed precision ({'/'.join(MIXED_PRECISIONS)})", mp_default,
          _one_of(MIXED_PRECISIONS, "mixed_precision"))  # fmt: skip
    field("gradient_accumulation_steps", "Gradient accumulation steps", cfg.gradient_accumulation_steps)
    field("start_method", f"Start method for notebook launches ({'/'.join(START_METHODS)})", cfg.start_method,
          _one_of(START_METHODS, "start_method"))  # fmt: skip
    field("dynamo_backend", "torch.compile backend (no/inductor/aot_eager/eager)", cfg.dynamo_backend,
          _one_of(DYNAMO_BACKENDS, "dynamo_backend"))  # fmt: skip
    if cfg.dynamo_backend != "no":
        field("dynamo_use_regional_compilation", "Compile only the repeated blocks (regional) (yes/no)",
              cfg.dynamo_use_regional_compilation, _yes_no("dynamo_use_regional_compilation"))  # fmt: skip
    cfg.validate()
    try:
        for note in cfg.check_hardware(hw):
            print(f"  note: {note}", file=out)
    except ConfigError as exc:
        print(f"  warning: {exc} (saved anyway: the config may be meant for another machine)", file=out)
    return cfg


def cmd_config_questions(path: str | None) -> int:
    try:
        cfg = questionnaire(path)
    except _Aborted:
        print(f"\n{PROG} config: no answer (end of input); nothing was written", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG} config: interrupted; nothing was written", file=sys.stderr)
        return 130
    written = save_config(cfg, path)
    print(f"accel_nb config written to {written}")
    print(f"  {describe(cfg)}")
    print(f"  launch a script with: {launch_command_line(cfg)}")
    return 0


# ------------------------------------------------------------------------------------ launch


def launch_command_line(cfg: LaunchConfig, script: str = "train.py", explicit: bool = True) -> str:
    """The ``accel-nb launch`` command equivalent to ``cfg`` (every flag given when ``explicit``)."""
    parts = [PROG, "launch"]
    if cfg.num_processes is not None:
        parts += ["--num_processes", str(cfg.num_processes)]
    if cfg.num_machines > 1:
        parts += ["--num_machines", str(cfg.num_machines), "--machine_rank", str(cfg.machine_rank)]
        parts += ["--main_process_ip", cfg.main_process_ip or "?"]
    if cfg.main_process_port:
        parts += ["--main_process_port", str(cfg.main_process_port)]
    if explicit or cfg.mixed_precision != "no":
        parts += ["--mixed_precision", cfg.mixed_precision]
    if cfg.gradient_accumulation_steps != 1:
        parts += ["--gradient_accumulation_steps", str(cfg.gradient_accumulation_steps)]
    if cfg.gpu_ids != "all" and not cfg.use_cpu:
        parts += ["--gpu_ids", cfg.gpu_ids]
    if cfg.use_cpu or cfg.distributed_type == "MULTI_CPU":
        parts.append("--cpu")
    parts.append(script)
    return " ".join(shlex.quote(p) for p in parts)


def add_deepspeed_flags(parser: argparse.ArgumentParser) -> None:
    """``--use_deepspeed`` and the reference's DeepSpeed flags (they fill the config's deepspeed_config)."""
    group = parser.add_argument_group("DeepSpeed (distributed_type DEEPSPEED; docs/deepspeed.md)")
    group.add_argument("--use_deepspeed", "--use-deepspeed", action="store_true", help="train with DeepSpeed ZeRO")
    group.add_argument("--zero_stage", "--zero-stage", type=int, choices=(0, 1, 2, 3), default=None)
    for name in ("offload_optimizer_device", "offload_param_device"):
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", choices=("none", "cpu", "nvme"), default=None)
    for name in ("offload_optimizer_nvme_path", "offload_param_nvme_path", "deepspeed_config_file"):
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", default=None)
    group.add_argument("--gradient_clipping", "--gradient-clipping", type=float, default=None)
    for name in ("zero3_init_flag", "zero3_save_16bit_model"):
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", choices=("true", "false"), default=None)


_DEEPSPEED_FLAGS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path",
                    "offload_param_nvme_path", "deepspeed_config_file", "gradient_clipping", "zero3_init_flag",
                    "zero3_save_16bit_model")  # fmt: skip


def _deepspeed_changes(ns: argparse.Namespace, cfg: LaunchConfig, changes: dict[str, Any]) -> None:
    given = {k: getattr(ns, k, None) for k in _DEEPSPEED_FLAGS if getattr(ns, k, None) is not None}
    if given and not getattr(ns, "use_deepspeed", False) and cfg.distributed_type != "DEEPSPEED":
        raise ConfigError(f"--{sorted(given)[0]}", next(iter(given.values())), "together with --use_deepspeed", None,
                          "a DeepSpeed flag without DeepSpeed would be ignored")  # fmt: skip
    if getattr(ns, "use_deepspeed", False):
        changes["distributed_type"] = "DEEPSPEED"
    if given:
        cfg.extras = {**cfg.extras, "deepspeed_config": {**(cfg.extras.get("deepspeed_config") or {}), **given}}


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
    _deepspeed_changes(ns, cfg, changes)
    try:
        return cfg.replace(**changes)
    except ConfigError as exc:
        flag = f"--{exc.key}" if changes.get(exc.key) is not None else exc.key
        raise ConfigError(flag, exc.value, exc.allowed, exc.path, getattr(exc, "reason", "")) from None


def torchrun_arguments(cfg: LaunchConfig, nproc: int, script: str, script_args: list[str], log_dir: str,
                       module: bool = False, monitor_interval: float | None = None,
                       endpoint: tuple[str, int] | None = None, rdzv_timeout: float | None = None) -> list[str]:  # fmt: skip
    """The argument list for ``torch.distributed.run`` that runs ``script`` as ``cfg`` says.

    ``endpoint`` is where the machines meet (default: :func:`accel_nb.launch.elastic.rendezvous.main_endpoint`).
    """
    from .launch.elastic.rendezvous import agent_arguments, main_endpoint

    addr, port = endpoint or main_endpoint(cfg)
    args = agent_arguments(cfg.num_machines, cfg.machine_rank, nproc, cfg.rdzv_backend, addr, port,
                           rdzv_timeout, cfg.max_restarts)  # fmt: skip
    args += ["--log_dir", log_dir, "--tee", "3"]
    if monitor_interval is not None:
        args += ["--monitor_interval", str(monitor_interval)]
    if module:
        args.append("--module")
    return args + [script] + list(script_args)


def cmd_launch(ns: argparse.Namespace) -> int:
    from .hardware import detect
    from .launch.elastic.rendezvous import check_endpoint, main_endpoint, rendezvous_failure
    from .launch.errors import LaunchSetupError
    from .launch.plan import CLI_CHOICES, check_one_gpu_per_rank

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
    if not ns.module and not os.path.isfile(ns.script):
        print(f"{PROG} launch: error: script {ns.script!r} not found (from {os.getcwd()})", file=sys.stderr)
        return 2
    endpoint = main_endpoint(cfg)
    check_endpoint(cfg, *endpoint)
    nproc = cfg.processes_here(hw)
    own_log_dir = ns.log_dir is None
    log_dir = ns.log_dir or tempfile.mkdtemp(prefix="accel_nb_launch_")
    device = "CPU" if cfg.use_cpu or not hw.num_gpus else "GPU"
    os.environ.update(cfg.to_env())
    os.environ.update(agent_environment(cfg, endpoint[0], device, ns.log_line_prefix_template))
    args = torchrun_arguments(cfg, nproc, ns.script, ns.script_args, log_dir, ns.module, ns.monitor_interval,
                              endpoint, ns.rdzv_timeout)  # fmt: skip
    print(f"{PROG} launch: {nproc} {device} process(es) on this machine"
          + (f" (machine {cfg.machine_rank} of {cfg.num_machines}, meeting at {endpoint[0]}:{endpoint[1]}, "
             f"{cfg.rdzv_backend} rendezvous)" if cfg.num_machines > 1 else "")
          + f", mixed_precision={cfg.mixed_precision}"
          + (f", torch.compile backend={cfg.dynamo_backend}" if cfg.dynamo_backend != "no" else ""),
          file=sys.stderr, flush=True)  # fmt: skip
    code = run_elastic(args, ns.script, log_dir,
                       lambda exc: rendezvous_failure(exc, cfg.num_machines, cfg.machine_rank, *endpoint,
                                                     ns.rdzv_timeout))  # fmt: skip
    if code == 0 and own_log_dir:
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)
    return code


def agent_environment(cfg: LaunchConfig, main_ip: str, device: str, template: str | None) -> dict[str, str]:
    """What the agent and its ranks need in the environment beyond the config's values.

    torchrun reads the log-line prefix template from the environment only; across machines it
    defaults to one naming the machine and the rank, and gloo gets the interface that reaches
    machine 0 unless ``GLOO_SOCKET_IFNAME`` is already set.
    """
    from .launch.elastic.rendezvous import gloo_interface_env, machine_label_template

    env: dict[str, str] = {}
    if template is None and cfg.num_machines > 1:
        template = machine_label_template(cfg.machine_rank)
    if template is not None:
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = template
    if cfg.num_machines > 1 and device == "CPU":
        env.update(gloo_interface_env(main_ip))
    return env


class _DropFailureLine:
    """Logging filter: torch's own "failed (exitcode ...)" line is replaced by our summary."""

    def filter(self, record: Any) -> bool:
        return not str(record.getMessage()).startswith("failed (exitcode")


def run_elastic(args: list[str], script: str, log_dir: str,
                explain: Callable[[BaseException], str | None] | None = None) -> int:  # fmt: skip
    """Run torch.distributed's elastic agent in this process; a readable summary when a rank fails.

    ``explain`` turns an error of the agent itself (a rendezvous that never completed) into one line.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    api_logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    drop = _DropFailureLine()
    api_logger.addFilter(drop)
    try:
        run(parse_args(args))
        return 0
    except ChildFailedError as exc:
        print(failure_summary(exc.failures, script, log_dir), file=sys.stderr, flush=True)
        first = order_failures(exc.failures, log_dir)[0][1]
        return first.exitcode if first.exitcode > 0 else 128 + (-first.exitcode or 1)
    except (KeyboardInterrupt, SignalException) as exc:
        sig = getattr(exc, "sigval", signal.SIGINT)
        print(f"{PROG} launch: stopped by {signal_name(sig)}; every rank was stopped "
              f"(logs under {log_dir})", file=sys.stderr)  # fmt: skip
        return 128 + int(sig)
    except Exception as exc:  # rendezvous errors and the like: one line, not a traceback
        said = explain(exc) if explain is not None else None
        print(f"{PROG} launch: error: {said or f'{type(exc).__name__}: {exc}'}", file=sys.stderr)
        return 1
    finally:
        api_logger.removeFilter(drop)


if __name__ == "__main__":
    sys.exit(main())
