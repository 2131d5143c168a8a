"""``accel-nb config``: the terminal questionnaire (every answer validated), and ``config default``.

The reference's config-file dataclasses are :mod:`accel_nb.commands.config.config_args`.

    accel-nb config                          # questions; Enter keeps the value in [brackets]
    accel-nb config default --mixed_precision bf16

The notebook's twin is ``config_wizard()``; both render the question table ``accel_nb.config.questions`` (its
prompts, choices, defaults and when each question is asked) and validate through ``LaunchConfig``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from ...config import (
    MIXED_PRECISION_CHOICES,
    ConfigError,
    LaunchConfig,
    default_config,
    derive_distributed_type,
    launch_command_line,
    load_config,
    save_config,
)
from ...config.command_line import PROG
from ...config.questions import QUESTIONS, answers_of, deepspeed_installed, question
from ...hardware import detect
from ...lazy_exports import lazy_exports
from .megatron_questions import megatron_questions, without_megatron

__all__ = ["add_parser", "run", "questionnaire", "describe", "parallelism_questions", "deepspeed_installed"]

# the reference's accelerate.commands.config names (config_args imports torch: on first use only)
__getattr__, __dir__ = lazy_exports(
    globals(), dict.fromkeys(["default_config_file", "load_config_from_file"], ".config_args")
)


def add_parser(sub: Any) -> None:
    """The ``config`` and ``config default`` subcommands of the ``accel-nb`` parser."""
    cfg = sub.add_parser("config", help="answer a few questions and save the launch config")
    cfg.add_argument(
        "--config_file", "--config-file", default=None, help="where to save (default: %(default)s)"
    )
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="{default}")
    dflt = cfg_sub.add_parser("default", help="save a config for this machine without questions")
    dflt.add_argument("--config_file", "--config-file", default=None, dest="config_file_default")
    dflt.add_argument("--mixed_precision", "--mixed-precision", choices=MIXED_PRECISION_CHOICES, default=None)


def run(ns: argparse.Namespace) -> int:
    """``accel-nb config [default]``: the questions, or a config for this machine without them."""
    if ns.config_command == "default":
        return cmd_config_default(ns.config_file_default or ns.config_file, ns.mixed_precision)
    return cmd_config_questions(ns.config_file)


def cmd_config_default(path: str | None, mixed_precision: str | None = None) -> int:
    cfg = default_config()
    if mixed_precision:
        cfg = cfg.replace(mixed_precision=mixed_precision)
    written = save_config(cfg, path)
    print(f"accel_nb config written to {written}")
    print(f"  {describe(cfg)}")
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


def _parser(key: str) -> Callable[[str], Any]:
    """How the terminal reads an answer to the question ``key``: by its kind in the table (numbers and text are
    read by ``LaunchConfig``, which names the key when it refuses one)."""
    q = question(key)
    if q.kind == "bool":
        return _yes_no(key)
    if q.kind == "choice":
        return _one_of(tuple(str(c) for c in q.accepted()), key)
    return str


def _ask_question(key: str, default: Any, out: Any, parse: Callable[[str], Any] | None = None) -> Any:
    """Ask the table's question ``key`` (its prompt, its parser unless ``parse`` is given)."""
    return _ask(question(key).cli_prompt(), default, parse or _parser(key), out)


def questionnaire(path: str | None = None, out: Any = None) -> LaunchConfig:
    """Ask for each setting in the terminal (``input()``), validating every answer; return the config."""
    out = out or sys.stdout
    hw = detect()
    try:
        base = load_config(path) if path is None or os.path.exists(path) else None
    except ConfigError as exc:
        print(f"The saved config cannot be used ({exc}); starting from this machine's defaults.", file=out)
        base = None
    base = base or default_config(hw)
    print(
        f"Detected: {hw.cpu_logical_cores} CPU cores, {hw.num_gpus} GPU(s)"
        + (f" ({', '.join(g.name for g in hw.gpus)})" if hw.gpus else "")
        + (f", TPU ({hw.tpu_chips} chips)" if hw.tpu_detected else "")
        + (f"; {hw.xla_runtime.describe()}" if hw.xla_runtime is not None else ""),
        file=out,
    )
    print("Press Enter to keep the value in [brackets].", file=out, flush=True)

    available = {"cpu": True, "gpu": bool(hw.num_gpus), "xla": hw.xla_available}
    choices = [c for c in question("compute").options() if available[c]]
    current = {"XLA": "xla", "MULTI_GPU": "gpu", "MULTI_CPU": "cpu"}.get(base.distributed_type)
    if current is None:
        current = "cpu" if base.use_cpu or not hw.num_gpus else "gpu"
    if current not in choices:
        current = "gpu" if hw.num_gpus else "cpu"
    prompt = f"Compute on ({'/'.join(choices)})"  # the choices this machine has
    compute = _ask(prompt, current, _one_of(choices, "compute"), out)
    cfg = _checked(base, compute)

    def asked(key: str) -> bool:  # the table's rule for ``key``, on the answers so far
        return question(key).asked(answers_of(cfg, compute))

    def field(key: str, default: Any, convert: Callable[[str], Any] | None = None) -> None:
        nonlocal cfg
        parse = convert or _parser(key)
        cfg = _ask(
            question(key).cli_prompt(), default, lambda r: _checked(cfg, compute, **{key: parse(r)}), out
        )

    field("num_machines", cfg.num_machines)
    if asked("machine_rank"):
        field("machine_rank", cfg.machine_rank)
        field("main_process_ip", cfg.main_process_ip)
        field("main_process_port", cfg.main_process_port or question("main_process_port").default)
        # any backend a config file may name is taken (a saved etcd one is kept): LaunchConfig validates it
        field("rdzv_backend", cfg.rdzv_backend, str)
        field("same_network", cfg.same_network)
    else:
        cfg = _checked(cfg, compute, machine_rank=0)
    xla_devices = hw.xla_runtime.num_devices if hw.xla_runtime is not None else 1
    per_machine = {"gpu": max(hw.num_gpus, 1), "cpu": 1, "xla": xla_devices}[compute]
    default_n = cfg.num_processes if cfg.num_processes is not None else per_machine * cfg.num_machines
    if compute == "gpu" and base.use_cpu:
        default_n = per_machine * cfg.num_machines
    field("num_processes", default_n)
    if asked("gpu_ids"):
        field("gpu_ids", cfg.gpu_ids)
    field(
        "mixed_precision", "no" if compute == "cpu" and cfg.mixed_precision == "fp16" else cfg.mixed_precision
    )
    field("gradient_accumulation_steps", cfg.gradient_accumulation_steps)
    if asked("use_deepspeed"):
        use_deepspeed = _ask_question("use_deepspeed", cfg.distributed_type == "DEEPSPEED", out)
        cfg = _deepspeed_questions(cfg, compute, out) if use_deepspeed else _without_deepspeed(cfg, compute)
    offer_megatron = asked("use_megatron_lm")
    if offer_megatron or cfg.distributed_type == "MEGATRON_LM":  # only GPUs run it (docs/megatron.md)
        cfg = _checked(
            megatron_questions(cfg, compute, out, _ask) if offer_megatron else without_megatron(cfg), compute
        )
    if asked("use_fsdp"):
        use_fsdp = _ask_question("use_fsdp", cfg.distributed_type == "FSDP", out)
        cfg = _with_fsdp(cfg, compute) if use_fsdp else _without_fsdp(cfg, compute)
    if asked("use_parallelism_config"):
        cfg = parallelism_questions(cfg, out)  # as the reference asks it: with FSDP2
    field("start_method", cfg.start_method)
    if asked("dynamo_backend"):
        field("dynamo_backend", cfg.dynamo_backend)
    else:
        cfg = _checked(cfg, compute, dynamo_backend="no")  # their engines are not compiled by accel_nb
    if asked("dynamo_use_regional_compilation"):
        field("dynamo_use_regional_compilation", cfg.dynamo_use_regional_compilation)
    cfg.validate()
    try:
        for note in cfg.check_hardware(hw):
            print(f"  note: {note}", file=out)
    except ConfigError as exc:
        print(f"  warning: {exc} (saved anyway: the config may be meant for another machine)", file=out)
    return cfg


def parallelism_questions(cfg: LaunchConfig, out: Any) -> LaunchConfig:
    """Ask whether to lay the processes out as FSDP × tensor/context parallel, and the sizes (docs/parallelism.md).

    ``dp_shard_size`` is what the processes leave after ``tp_size × cp_size × dp_replicate_size``
    (``accel_nb.parallel.config.layout_settings``, which the notebook wizard uses too); a size that
    does not divide the number of processes, or sizes that do not fit together, are asked again.
    """
    # deferred: only this question needs them
    from ...parallel.config import LayoutError, layout_settings, proposed_tp_size

    current = dict(cfg.extras.get("parallelism_config") or {})
    new = dataclasses.replace(cfg)
    new.extras = {k: v for k, v in cfg.extras.items() if k != "parallelism_config"}
    use = _ask_question("use_parallelism_config", bool(current), out)
    if not use:
        return new
    n = cfg.num_processes or 1

    def size(key: str) -> Callable[[str], int]:
        def parse(raw: str) -> int:
            if not raw.isdigit() or int(raw) < 1 or n % int(raw):
                raise ValueError(
                    f"{key} must be a whole number >= 1 that divides the {n} processes, got {raw!r}"
                )
            return int(raw)

        return parse

    # the table's defaults; tp's is computed from the processes
    defaults = {
        "tp_size": proposed_tp_size(n),
        **{k: question(k).default for k in ("cp_size", "dp_replicate_size")},
    }
    while True:
        sizes = {
            key: _ask_question(key, current.get(f"parallelism_config_{key}", default), out, size(key))
            for key, default in defaults.items()
        }
        try:
            new.extras["parallelism_config"] = layout_settings(
                n, **sizes, fsdp=cfg.distributed_type == "FSDP"
            )
            break
        except LayoutError as exc:  # the product does not divide n, or replicas with TP and no FSDP shard
            print(f"  ! {exc}", file=out)
    layout = new.extras["parallelism_config"]
    print(
        "  layout: "
        + " × ".join(
            f"{k}={layout[f'parallelism_config_{k}_size']}" for k in ("dp_replicate", "dp_shard", "cp", "tp")
        ),
        file=out,
    )
    return new


def _without_deepspeed(cfg: LaunchConfig, compute: str) -> LaunchConfig:
    """``cfg`` with DeepSpeed turned off: its ``deepspeed_config`` goes, the type follows the process count."""
    if cfg.distributed_type != "DEEPSPEED" and "deepspeed_config" not in cfg.extras:
        return cfg
    new = dataclasses.replace(cfg, distributed_type="NO")
    new.extras = {k: v for k, v in cfg.extras.items() if k != "deepspeed_config"}
    return _checked(new, compute)


def _with_deepspeed(cfg: LaunchConfig, compute: str, settings: dict[str, Any]) -> LaunchConfig:
    """``cfg`` training with DeepSpeed under ``settings`` (a ``deepspeed_config`` mapping), validated."""
    new = dataclasses.replace(cfg, distributed_type="DEEPSPEED", dynamo_backend="no")
    # an FSDP config left from before would be inert with DeepSpeed: it goes
    new.extras = {k: v for k, v in cfg.extras.items() if k != "fsdp_config"}
    new.extras["deepspeed_config"] = dict(settings)
    new.use_cpu = compute == "cpu"
    return new.validate()


def _with_fsdp(cfg: LaunchConfig, compute: str) -> LaunchConfig:
    """``cfg`` sharding with FSDP2 (``distributed_type: FSDP``); a saved ``fsdp_config`` stays with it."""
    if cfg.distributed_type == "FSDP":
        return cfg
    new = dataclasses.replace(cfg, distributed_type="FSDP")
    new.extras = dict(cfg.extras)
    return _checked(new, compute)


def _without_fsdp(cfg: LaunchConfig, compute: str) -> LaunchConfig:
    """``cfg`` without FSDP: its ``fsdp_config`` goes, the type follows the process count (as in the wizard)."""
    if cfg.distributed_type != "FSDP" and "fsdp_config" not in cfg.extras:
        return cfg
    new = dataclasses.replace(cfg, distributed_type="NO")
    new.extras = {k: v for k, v in cfg.extras.items() if k != "fsdp_config"}
    return _checked(new, compute)


def _number_at_least_zero(key: str) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(key, raw, "a number >= 0 (0: no clipping)") from None
        if value < 0 or value != value:
            raise ConfigError(key, raw, "a number >= 0 (0: no clipping)")
        return value

    return parse


def _deepspeed_questions(cfg: LaunchConfig, compute: str, out: Any) -> LaunchConfig:
    """The table's DeepSpeed questions, each where its rule holds; every answer is checked by ``DeepSpeedPlugin``
    as a launch would check it."""
    old = dict(cfg.extras.get("deepspeed_config") or {}) if cfg.distributed_type == "DEEPSPEED" else {}
    settings: dict[str, Any] = {}

    def checked(key: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
        def check(raw: str) -> Any:
            value = parse(raw)
            trial = {**settings, key: value}
            if key.endswith("_device") and value == "nvme":  # its folder is the next question
                trial[key.replace("_device", "_nvme_path")] = "/nvme"
            try:
                _with_deepspeed(cfg, compute, trial)
            except ConfigError as exc:  # the plugin's reason, without the whole mapping
                raise ConfigError(key, value, exc.allowed, None, exc.reason or str(exc)) from None
            return value

        return check

    def path_or_none(raw: str) -> str | None:
        return (
            None
            if raw.strip().lower() in ("", "none", "no")
            else os.path.abspath(os.path.expanduser(raw.strip()))
        )

    parsers = {
        "deepspeed_config_file": path_or_none,
        "offload_optimizer_nvme_path": path_or_none,
        "offload_param_nvme_path": path_or_none,
        "zero_stage": lambda r: int(_parser("zero_stage")(r)),
        "gradient_clipping": _number_at_least_zero("gradient_clipping"),
    }
    for q in QUESTIONS:
        if (
            q.section != "deepspeed"
            or q.key == "use_deepspeed"
            or not q.asked({"use_deepspeed": True, **settings})
        ):
            continue
        default = old.get(q.key, q.default)
        default = q.default if default is None else _as_bool(default) if q.kind == "bool" else default
        settings[q.key] = _ask(
            q.cli_prompt(), default, checked(q.key, parsers.get(q.key) or _parser(q.key)), out
        )
        if q.key == "deepspeed_config_file" and settings[q.key] is None:
            del settings[q.key]  # none: the questions instead
    kept = {k: v for k, v in old.items() if k in ("deepspeed_multinode_launcher", "deepspeed_hostfile")}
    return _with_deepspeed(cfg, compute, {**kept, **settings})


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")


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
