"""``accel-nb config``: the terminal questionnaire (every answer validated), and ``config default``.

The reference's config-file dataclasses are :mod:`accel_nb.commands.config.config_args`.

    accel-nb config                          # questions; Enter keeps the value in [brackets]
    accel-nb config default --mixed_precision bf16

The notebook's twin is ``config_wizard()``; both validate through ``LaunchConfig``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from ...config import (
    DYNAMO_BACKENDS,
    LAUNCHER_RDZV_BACKENDS,
    MIXED_PRECISION_CHOICES,
    START_METHODS,
    ConfigError,
    LaunchConfig,
    default_config,
    derive_distributed_type,
    launch_command_line,
    load_config,
    save_config,
)
from ...config.command_line import PROG
from ...hardware import detect
from ...lazy_exports import lazy_exports
from ...precision.setting import offered_mixed_precisions
from .megatron_questions import megatron_installed, megatron_questions, without_megatron

__all__ = ["add_parser", "run", "questionnaire", "describe", "parallelism_questions"]

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
        field("rdzv_backend", f"Rendezvous backend ({'/'.join(LAUNCHER_RDZV_BACKENDS)})", cfg.rdzv_backend)
        field(
            "same_network",
            "Are all machines on the same network (yes/no)",
            cfg.same_network,
            _yes_no("same_network"),
        )
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
    offered = offered_mixed_precisions()  # fp8 only where an FP8 library (torchao) is installed
    field(
        "mixed_precision",
        f"Mixed precision ({'/'.join(offered)})",
        mp_default,
        _one_of(offered, "mixed_precision"),
    )
    field("gradient_accumulation_steps", "Gradient accumulation steps", cfg.gradient_accumulation_steps)
    if compute != "xla" and deepspeed_installed():
        use_deepspeed = _ask(
            "Train with DeepSpeed ZeRO (yes/no)",
            cfg.distributed_type == "DEEPSPEED",
            _yes_no("use_deepspeed"),
            out,
        )
        cfg = _deepspeed_questions(cfg, compute, out) if use_deepspeed else _without_deepspeed(cfg, compute)
    offer_megatron = compute == "gpu" and cfg.distributed_type != "DEEPSPEED" and megatron_installed()
    if offer_megatron or cfg.distributed_type == "MEGATRON_LM":  # only GPUs run it (docs/megatron.md)
        cfg = _checked(
            megatron_questions(cfg, compute, out, _ask) if offer_megatron else without_megatron(cfg), compute
        )
    if (
        compute != "xla"
        and cfg.distributed_type not in ("DEEPSPEED", "MEGATRON_LM")
        and int(cfg.num_processes or 1) > 1
    ):
        use_fsdp = _ask(
            "Do you want to use FullyShardedDataParallel (FSDP2) (yes/no)",
            cfg.distributed_type == "FSDP",
            _yes_no("use_fsdp"),
            out,
        )
        cfg = _with_fsdp(cfg, compute) if use_fsdp else _without_fsdp(cfg, compute)
    if compute != "xla" and (cfg.distributed_type == "FSDP" or cfg.extras.get("parallelism_config")):
        cfg = parallelism_questions(cfg, out)  # as the reference asks it: with FSDP2
    field(
        "start_method",
        f"Start method for notebook launches ({'/'.join(START_METHODS)})",
        cfg.start_method,
        _one_of(START_METHODS, "start_method"),
    )
    if cfg.distributed_type in ("DEEPSPEED", "MEGATRON_LM"):
        cfg = _checked(cfg, compute, dynamo_backend="no")  # their engines are not compiled by accel_nb
    else:
        field(
            "dynamo_backend",
            "torch.compile backend (no/inductor/aot_eager/eager)",
            cfg.dynamo_backend,
            _one_of(DYNAMO_BACKENDS, "dynamo_backend"),
        )
    if cfg.dynamo_backend != "no":
        field(
            "dynamo_use_regional_compilation",
            "Compile only the repeated blocks (regional) (yes/no)",
            cfg.dynamo_use_regional_compilation,
            _yes_no("dynamo_use_regional_compilation"),
        )
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
    use = _ask(
        "Lay the processes out as FSDP x tensor/context parallel (ParallelismConfig) (yes/no)",
        bool(current),
        _yes_no("use_parallelism_config"),
        out,
    )
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

    questions = (
        ("tp_size", "Tensor-parallel size (processes that split each layer)", proposed_tp_size(n)),
        ("cp_size", "Context-parallel size (processes that split each sequence)", 1),
        ("dp_replicate_size", "Replicas (dp_replicate_size; 1 = FSDP over all the others)", 1),
    )
    while True:
        sizes = {
            key: _ask(prompt, current.get(f"parallelism_config_{key}", default), size(key), out)
            for key, prompt, default in questions
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


def deepspeed_installed() -> bool:
    """Whether ``deepspeed`` can be imported here (checked without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


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
    """The DeepSpeed questions; every answer is checked by ``DeepSpeedPlugin`` as a launch would check it."""
    old = dict(cfg.extras.get("deepspeed_config") or {}) if cfg.distributed_type == "DEEPSPEED" else {}
    settings: dict[str, Any] = {}

    def ask(key: str, prompt: str, default: Any, parse: Callable[[str], Any]) -> None:
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

        settings[key] = _ask(prompt, default, check, out)

    def path_or_none(raw: str) -> str | None:
        return (
            None
            if raw.strip().lower() in ("", "none", "no")
            else os.path.abspath(os.path.expanduser(raw.strip()))
        )

    file_default = old.get("deepspeed_config_file") or "none"
    ask(
        "deepspeed_config_file",
        "A DeepSpeed JSON config file (none: answer the questions instead)",
        file_default,
        path_or_none,
    )
    if settings["deepspeed_config_file"] is None:
        del settings["deepspeed_config_file"]
        stages = ("0", "1", "2", "3")
        ask(
            "zero_stage",
            "ZeRO stage (0/1/2/3)",
            old.get("zero_stage", 2),
            lambda r: int(_one_of(stages, "zero_stage")(r)),
        )
        stage = settings["zero_stage"]
        devices = ("none", "cpu", "nvme")
        if stage >= 1:
            ask(
                "offload_optimizer_device",
                "Offload the optimizer state to (none/cpu/nvme)",
                old.get("offload_optimizer_device", "none"),
                _one_of(devices, "offload_optimizer_device"),
            )
            if settings["offload_optimizer_device"] == "nvme":
                ask(
                    "offload_optimizer_nvme_path",
                    "Folder on the NVMe drive for the optimizer state",
                    old.get("offload_optimizer_nvme_path"),
                    path_or_none,
                )
        if stage == 3:
            ask(
                "offload_param_device",
                "Offload the parameters to (none/cpu/nvme)",
                old.get("offload_param_device", "none"),
                _one_of(devices, "offload_param_device"),
            )
            if settings["offload_param_device"] == "nvme":
                ask(
                    "offload_param_nvme_path",
                    "Folder on the NVMe drive for the parameters",
                    old.get("offload_param_nvme_path"),
                    path_or_none,
                )
        ask(
            "gradient_clipping",
            "Clip the gradient norm at (0: no clipping)",
            old.get("gradient_clipping", 1.0),
            _number_at_least_zero("gradient_clipping"),
        )
        if stage == 3:
            ask(
                "zero3_save_16bit_model",
                "Gather the shards into one model file in save_model (yes/no)",
                _as_bool(old.get("zero3_save_16bit_model", True)),
                _yes_no("zero3_save_16bit_model"),
            )
            ask(
                "zero3_init_flag",
                "Partition big models as they are built, inside zero3_init(accelerator) (yes/no)",
                _as_bool(old.get("zero3_init_flag", True)),
                _yes_no("zero3_init_flag"),
            )
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
