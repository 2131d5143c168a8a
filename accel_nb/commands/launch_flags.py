"""The reference's ``accelerate launch`` flags on ``accel-nb launch``: the ones accel_nb runs, and the rest refused.

``accel-nb launch`` takes every flag of the reference's launcher, so command lines and code that builds the
reference's namespace (``launch_command_parser().parse_args(...)``) work unchanged. The flags accel_nb runs are
listed in ``--help``; the others are parsed, left out of ``--help``, and refused with the reason when given
(``refuse_unbuilt``). Each flag takes hyphens or underscores; ``--help`` shows the underscore spelling only.

    parser = argparse.ArgumentParser(formatter_class=UnderscoreHelpFormatter)
    track_given(parser)              # ns.nondefault: the flags given on the command line
    add_reference_flags(parser)
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import DYNAMO_BACKENDS, ConfigError, LaunchConfig, default_config, find_config_file
from ..megatron.plugin import LAUNCH_FIELDS as MEGATRON_FIELDS

__all__ = [
    "FSDP_FLAGS",
    "UnderscoreHelpFormatter",
    "add_deepspeed_flags",
    "add_megatron_flags",
    "add_parallelism_flags",
    "add_reference_flags",
    "deepspeed_changes",
    "parallelism_changes",
    "given_flags",
    "reference_changes",
    "refuse_unbuilt",
    "track_given",
    "validate_launch_args",
]

_MIGRATION = "docs/migration.md"
# dest -> why accel_nb refuses the flag (it is parsed, hidden from --help, an error when given)
UNBUILT: dict[str, str] = {
    "no_python": "accel-nb launch runs Python scripts (or modules with -m)",
    "tpu": "a TPU launch reads distributed_type: XLA from the config (accel-nb config; docs/tpu.md)",
    "tpu_use_cluster": "TPU pod launches are not supported; run accel-nb tpu-config, then accel-nb launch on each VM",
    "tpu_use_sudo": "TPU pod launches are not supported",
    "vm": "TPU pod launches are not supported",
    "env": "TPU pod launches are not supported",
    "downcast_bf16": "downcast_bf16 (XLA_DOWNCAST_BF16) is not supported by accel_nb",
    "enable_cpu_affinity": "CPU (NUMA) affinity is not set by accel_nb",
    "aws_access_key_id": "SageMaker launches are not supported by accel_nb",
    "aws_secret_access_key": "SageMaker launches are not supported by accel_nb",
    "mpirun_hostfile": "accel_nb launches CPU processes across machines with torchrun (--num_machines, "
    "--main_process_ip), not mpirun",
    "tee": "accel-nb launch tees every rank's output itself (its logs: --log_dir)",
    "role": "torchrun's worker role is not settable with accel-nb launch",
    "rdzv_conf": "extra rendezvous settings are not supported; accel-nb launch takes --rdzv_backend and --rdzv_timeout",
    "fsdp_activation_checkpointing_offload": "activation_checkpointing_offload is not supported by accel_nb's FSDP",
    **{
        f"deepspeed_{n}": "accel-nb launch starts DeepSpeed ranks through torchrun, not DeepSpeed's own launcher"
        for n in ("hostfile", "exclusion_filter", "inclusion_filter", "multinode_launcher")
    },
    "deepspeed_moe_layer_cls_names": "DeepSpeed mixture-of-experts layers are not supported by accel_nb",
    **{
        f"parallelism_config_sp_{n}": "DeepSpeed sequence parallelism is not supported by accel_nb"
        for n in ("size", "backend", "seq_length", "seq_length_is_variable", "attn_implementation")
    },
}
# the FSDP flags accel_nb's fsdp_config reads (docs/configuration.md), as fsdp_config keys
FSDP_FLAGS = (
    "fsdp_version",
    "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params",
    "fsdp_offload_params",
    "fsdp_activation_checkpointing",
    "fsdp_state_dict_type",
)
_FSDP1_ONLY = (
    "fsdp_backward_prefetch",
    "fsdp_forward_prefetch",
    "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading",
)


class UnderscoreHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each flag once, in its underscore spelling (``--num_processes``); hyphens work as well."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [s for s in action.option_strings if not (s.startswith("--") and "-" in s[2:])]
        if not shown or shown == action.option_strings:
            return super()._format_action_invocation(action)
        copy = argparse.Action(shown, action.dest, action.nargs, help=action.help, metavar=action.metavar)
        copy.choices = action.choices
        copy.const = action.const
        return super()._format_action_invocation(copy)

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        return super()._format_usage(usage, [_one_spelling(a) for a in actions], groups, prefix)


def _one_spelling(action: argparse.Action) -> argparse.Action:
    if not action.option_strings:
        return action
    shown = [
        s for s in action.option_strings if not (s.startswith("--") and "-" in s[2:])
    ] or action.option_strings
    copy = argparse.Action(shown, action.dest, action.nargs, required=action.required, metavar=action.metavar)
    copy.choices, copy.help, copy.const = action.choices, action.help, action.const
    return copy


def _tracked(base: type) -> type:
    class Tracked(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            if getattr(namespace, "nondefault", None) is None:
                namespace.nondefault = set()
            namespace.nondefault.add(self.dest)

    return Tracked


def track_given(parser: argparse.ArgumentParser) -> None:
    """Record in ``ns.nondefault`` (the reference's name) the dests of the flags given on the command line.

    Call before adding arguments; values given there win over the config file's (``validate_launch_args``).
    """
    for name in (None, "store", "store_true", "store_false", "store_const", "append"):  # None: the default
        parser.register("action", name, _tracked(parser._registry_get("action", name)))
    parser.set_defaults(nondefault=None)


def given_flags(ns: argparse.Namespace) -> set[str]:
    """The dests given on the command line (empty for a namespace built by hand)."""
    return set(getattr(ns, "nondefault", None) or ())


def _flag(name: str) -> tuple[str, ...]:
    hyphens = f"--{name.replace('_', '-')}"
    return (f"--{name}", hyphens) if "_" in name else (hyphens,)


def add_reference_flags(parser: argparse.ArgumentParser) -> None:
    """The reference's flags that ``accel-nb launch`` did not have: built ones listed, the rest hidden."""
    hidden = argparse.SUPPRESS
    parser.add_argument(
        *_flag("multi_gpu"), action="store_true", help="GPU processes (distributed_type MULTI_GPU)"
    )
    parser.add_argument(*_flag("same_network"), action="store_true", help="all machines are on one network")
    parser.add_argument(
        *_flag("num_cpu_threads_per_process"), type=int, default=None, help="OMP_NUM_THREADS of each rank"
    )
    parser.add_argument(
        "--debug", action="store_true", help=hidden
    )  # ACCELERATE_DEBUG_MODE for the reference's code
    parser.add_argument(
        *_flag("quiet"), "-q", action="store_true", help=hidden
    )  # failures are summarised already
    parser.add_argument(*_flag("no_python"), action="store_true", help=hidden)
    dynamo = parser.add_argument_group("torch.compile (dynamo_config; docs/compile.md)")
    dynamo.add_argument(*_flag("dynamo_backend"), type=str.lower, choices=DYNAMO_BACKENDS, default=None)
    dynamo.add_argument(
        *_flag("dynamo_mode"), choices=("default", "reduce-overhead", "max-autotune"), default="default"
    )
    for name in ("dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation"):
        dynamo.add_argument(*_flag(name), action="store_true")
    fsdp = parser.add_argument_group("FSDP (distributed_type FSDP, run as FSDP2; docs/fsdp.md)")
    fsdp.add_argument(*_flag("use_fsdp"), action="store_true", help="shard the model with FSDP")
    fsdp.add_argument(*_flag("fsdp_version"), choices=("1", "2"), default=None, help="accel_nb runs 2")
    for name in ("sharding_strategy", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "state_dict_type"):
        fsdp.add_argument(*_flag(f"fsdp_{name}"), default=None)
    fsdp.add_argument(*_flag("fsdp_min_num_params"), type=int, default=None)
    for name in ("reshard_after_forward", "offload_params", "activation_checkpointing"):
        fsdp.add_argument(*_flag(f"fsdp_{name}"), choices=("true", "false"), type=str.lower, default=None)
    for name in _FSDP1_ONLY:  # FSDP1 settings: FSDP2 has nothing to apply them to (a warning)
        fsdp.add_argument(*_flag(name), default=None, help=hidden)
    fsdp.add_argument(
        *_flag("fsdp_sync_module_states"), default="true", help=hidden
    )  # the reference's default
    fsdp.add_argument(*_flag("fsdp_activation_checkpointing_offload"), default="false", help=hidden)
    parser.add_argument(*_flag("tpu"), action="store_true", help=hidden)
    parser.add_argument(
        "--tpu_cluster", "--tpu-cluster", action="store_true", dest="tpu_use_cluster", help=hidden
    )
    parser.add_argument(
        "--no_tpu_cluster", "--no-tpu-cluster", action="store_false", dest="tpu_use_cluster", help=hidden
    )
    parser.add_argument(*_flag("tpu_use_sudo"), action="store_true", help=hidden)
    for name in ("vm", "env"):
        parser.add_argument(f"--{name}", action="append", default=None, help=hidden)
    parser.add_argument(*_flag("main_training_function"), default=None, help=hidden)
    parser.add_argument(*_flag("downcast_bf16"), action="store_true", help=hidden)
    parser.add_argument(*_flag("enable_cpu_affinity"), action="store_true", help=hidden)
    add_megatron_flags(parser)
    for name in ("aws_access_key_id", "aws_secret_access_key", "mpirun_hostfile"):
        parser.add_argument(*_flag(name), default=None, help=hidden)
    parser.add_argument("-t", "--tee", default="0", help=hidden)
    parser.add_argument("--role", default="default", help=hidden)
    parser.add_argument(*_flag("rdzv_conf"), default="", help=hidden)
    for name in (
        "hostfile",
        "exclusion_filter",
        "inclusion_filter",
        "multinode_launcher",
        "moe_layer_cls_names",
    ):
        parser.add_argument(*_flag(f"deepspeed_{name}"), default=None, help=hidden)
    for name in ("size", "backend", "seq_length", "seq_length_is_variable", "attn_implementation"):
        parser.add_argument(*_flag(f"parallelism_config_sp_{name}"), default=None, help=hidden)
    parser.add_argument(*_flag("fp8_backend"), default=None, help=hidden)
    for name in (
        "margin",
        "interval",
        "format",
        "amax_history_len",
        "amax_compute_algo",
        "override_linear_precision",
    ):
        parser.add_argument(*_flag(f"fp8_{name}"), default=None, help=hidden)
    for name in ("opt_level", "enable_fsdp_float8_all_gather", "pad_inner_dim"):
        parser.add_argument(*_flag(f"fp8_{name}"), default=None, help=hidden)
    parser.add_argument(*_flag("fp8_use_autocast_during_eval"), action="store_true", help=hidden)


def add_megatron_flags(parser: argparse.ArgumentParser) -> None:
    """``--use_megatron_lm`` and the reference's ``--megatron_lm_*`` flags (they fill the config's megatron_lm_config)."""
    group = parser.add_argument_group(
        "Megatron-LM (distributed_type MEGATRON_LM; GPUs only; docs/megatron.md)"
    )
    group.add_argument(*_flag("use_megatron_lm"), action="store_true", help="train with Megatron-LM")
    for name in MEGATRON_FIELDS:
        group.add_argument(*_flag(f"megatron_lm_{name}"), default=None, help=f"MegatronLMPlugin({name}=...)")


def refuse_unbuilt(ns: argparse.Namespace) -> None:
    """``ConfigError`` for the first flag given on the command line that accel_nb does not run (with the reason)."""
    given = given_flags(ns)
    for dest in sorted(given):
        reason = UNBUILT.get(dest)
        if reason is not None:
            raise ConfigError(f"--{dest}", getattr(ns, dest, None), "leave it out", None, reason)


def _bool(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def reference_changes(ns: argparse.Namespace, cfg: LaunchConfig, changes: dict[str, Any]) -> None:
    """Apply the reference's built flags in ``ns`` (``--multi_gpu``, ``--use_fsdp``/``--fsdp_*``, ``--dynamo_*``,
    ``--same_network``) to ``changes`` for ``cfg.replace`` (and ``cfg.extras`` for the FSDP keys)."""
    if getattr(ns, "multi_gpu", False):
        changes.update(distributed_type="MULTI_GPU", use_cpu=False)
    if getattr(ns, "same_network", False):
        changes["same_network"] = True
    backend = getattr(ns, "dynamo_backend", None)
    if backend is not None:
        changes["dynamo_backend"] = str(backend).lower()
        changes["dynamo_mode"] = getattr(ns, "dynamo_mode", None) or "default"
        for name in ("dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation"):
            changes[name] = _bool(getattr(ns, name, False))
    # FP8: --fp8_backend, --fp8_pad_inner_dim, ... join the config's fp8_config (ACCELERATE_FP8_* for the ranks)
    fp8 = {
        k.removeprefix("fp8_"): v
        for k, v in vars(ns).items()
        if k.startswith("fp8_") and v not in (None, False)
    }
    if fp8:
        cfg.extras = {**cfg.extras, "fp8_config": {**(cfg.extras.get("fp8_config") or {}), **fp8}}
    if getattr(ns, "use_megatron_lm", False):
        changes["distributed_type"] = "MEGATRON_LM"
        given = {f"megatron_lm_{n}": getattr(ns, f"megatron_lm_{n}", None) for n in MEGATRON_FIELDS}
        given = {k: v for k, v in given.items() if v is not None}
        cfg.extras = {
            **cfg.extras,
            "megatron_lm_config": {**(cfg.extras.get("megatron_lm_config") or {}), **given},
        }
    if getattr(ns, "use_fsdp", False):
        changes["distributed_type"] = "FSDP"
        given = {k: getattr(ns, k) for k in FSDP_FLAGS if getattr(ns, k, None) is not None}
        if given.get("fsdp_version") is not None:
            given["fsdp_version"] = int(given["fsdp_version"])
        cfg.extras = {**cfg.extras, "fsdp_config": {**(cfg.extras.get("fsdp_config") or {}), **given}}


_PARADIGMS = ("cpu", "multi_gpu", "tpu", "use_deepspeed", "use_fsdp")
# config mappings whose keys become flags: mapping -> prefix a key gets when it lacks one
_PREFIXES = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}


def validate_launch_args(ns: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """The reference's ``_validate_launch_command``: ``ns`` completed from the config file, in place.

    Flags given on the command line (``ns.nondefault``) win; every other value comes from the config file
    (``--config_file``, else the saved one), or from this machine's defaults without one. Returns ``(ns,
    defaults, mixed_precision_from_config)`` where ``defaults`` is the file's ``ClusterConfig`` (None without a
    file). ``ValueError`` for flags that contradict each other and for a file with unknown keys.
    """
    chosen = [f"--{p}" for p in _PARADIGMS if getattr(ns, p, False)]
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(chosen)} exclude each other: give one of {', '.join(_PARADIGMS)}")
    if getattr(ns, "multi_gpu", False) and ns.num_processes is not None and ns.num_processes < 2:
        raise ValueError(f"--multi_gpu needs at least 2 processes, not --num_processes {ns.num_processes}")
    path = ns.config_file or find_config_file()
    if path is None:
        _machine_defaults(ns)
        return ns, None, False
    from .config.config_args import ClusterConfig, load_config_from_file  # deferred: import time (torch)

    defaults = load_config_from_file(path)
    if not isinstance(defaults, ClusterConfig):
        raise ConfigError(
            "compute_environment",
            "AMAZON_SAGEMAKER",
            "LOCAL_MACHINE",
            path,
            "accel_nb does not launch on SageMaker",
        )
    kind = str(getattr(defaults.distributed_type, "value", defaults.distributed_type))
    if not any(getattr(ns, p, False) for p in (*_PARADIGMS[1:], "use_megatron_lm")):
        ns.use_deepspeed = kind == "DEEPSPEED"
        ns.multi_gpu = kind == "MULTI_GPU"
        ns.tpu = kind == "XLA"
        ns.use_fsdp = kind == "FSDP"
        ns.use_megatron_lm = kind == "MEGATRON_LM"
        ns.tpu_use_cluster = bool(defaults.tpu_use_cluster) if ns.tpu else False
        ns.use_parallelism_config = bool(defaults.parallelism_config)
    if ns.gpu_ids is None:
        ns.gpu_ids = defaults.gpu_ids if defaults.gpu_ids is not None else "all"
    if ns.multi_gpu and getattr(ns, "num_machines", None) is None:
        ns.num_machines = defaults.num_machines
    given = given_flags(ns)
    for name, value in vars(defaults).items():
        if isinstance(value, dict):
            for key, item in value.items():
                prefix = _PREFIXES.get(name, "")
                key = key if key.startswith(prefix) else prefix + key
                if key not in given:
                    setattr(ns, key, item)
        elif name not in ("compute_environment", "mixed_precision", "distributed_type"):
            if getattr(ns, name, None) is None:
                setattr(ns, name, value)
    ns.debug = bool(getattr(ns, "debug", False) or defaults.debug)
    from_config = not ns.mixed_precision
    if from_config:
        ns.mixed_precision = defaults.mixed_precision or "no"
    if getattr(ns, "dynamo_backend", None) is None:
        ns.dynamo_backend = "no"
    if ns.num_processes == -1:
        ns.num_processes = None  # accel_nb's meaning of -1: one process per GPU (else one)
    return ns, defaults, from_config and defaults.mixed_precision is not None


def _machine_defaults(ns: argparse.Namespace) -> None:
    """Without a config file: this machine's defaults (``accel_nb.config.default_config``) where no flag says."""
    machine = default_config()
    if ns.num_processes is None:
        ns.num_processes = machine.processes_here()
    if getattr(ns, "num_machines", None) is None:
        ns.num_machines = 1
    if not ns.mixed_precision:
        ns.mixed_precision = "no"
    ns.use_cpu = bool(ns.cpu)
    ns.debug = bool(getattr(ns, "debug", False))
    if getattr(ns, "dynamo_backend", None) is None:
        ns.dynamo_backend = "no"


def add_deepspeed_flags(parser: argparse.ArgumentParser) -> None:
    """``--use_deepspeed`` and the reference's DeepSpeed flags (they fill the config's deepspeed_config)."""
    group = parser.add_argument_group("DeepSpeed (distributed_type DEEPSPEED; docs/deepspeed.md)")
    group.add_argument(
        "--use_deepspeed", "--use-deepspeed", action="store_true", help="train with DeepSpeed ZeRO"
    )
    group.add_argument("--zero_stage", "--zero-stage", type=int, choices=(0, 1, 2, 3), default=None)
    for name in ("offload_optimizer_device", "offload_param_device"):
        group.add_argument(
            f"--{name}", f"--{name.replace('_', '-')}", choices=("none", "cpu", "nvme"), default=None
        )
    for name in ("offload_optimizer_nvme_path", "offload_param_nvme_path", "deepspeed_config_file"):
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", default=None)
    group.add_argument("--gradient_clipping", "--gradient-clipping", type=float, default=None)
    for name in ("zero3_init_flag", "zero3_save_16bit_model"):
        group.add_argument(
            f"--{name}", f"--{name.replace('_', '-')}", choices=("true", "false"), default=None
        )


_DEEPSPEED_FLAGS = (
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "deepspeed_config_file",
    "gradient_clipping",
    "zero3_init_flag",
    "zero3_save_16bit_model",
)


def deepspeed_changes(ns: argparse.Namespace, cfg: LaunchConfig, changes: dict[str, Any]) -> None:
    given = {k: getattr(ns, k, None) for k in _DEEPSPEED_FLAGS if getattr(ns, k, None) is not None}
    if given and not getattr(ns, "use_deepspeed", False) and cfg.distributed_type != "DEEPSPEED":
        raise ConfigError(
            f"--{sorted(given)[0]}",
            next(iter(given.values())),
            "together with --use_deepspeed",
            None,
            "a DeepSpeed flag without DeepSpeed would be ignored",
        )
    if getattr(ns, "use_deepspeed", False):
        changes["distributed_type"] = "DEEPSPEED"
    if given:
        cfg.extras = {
            **cfg.extras,
            "deepspeed_config": {**(cfg.extras.get("deepspeed_config") or {}), **given},
        }


_PARALLELISM_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")


def add_parallelism_flags(parser: argparse.ArgumentParser) -> None:
    """``--use_parallelism_config`` and the reference's ``--parallelism_config_*`` flags (docs/parallelism.md)."""
    group = parser.add_argument_group("Parallelism layout (ParallelismConfig; docs/parallelism.md)")
    group.add_argument(
        "--use_parallelism_config",
        "--use-parallelism-config",
        action="store_true",
        help="lay the processes out on a dp_replicate x dp_shard x cp x tp mesh (sizes below; a size flag implies it)",
    )
    for name in _PARALLELISM_SIZES:
        flag = f"parallelism_config_{name}"
        group.add_argument(f"--{flag}", f"--{flag.replace('_', '-')}", type=int, default=None)
    group.add_argument(
        "--parallelism_config_cp_backend", "--parallelism-config-cp-backend", choices=("torch",), default=None
    )
    group.add_argument(
        "--parallelism_config_cp_comm_strategy",
        "--parallelism-config-cp-comm-strategy",
        choices=("allgather", "alltoall"),
        default=None,
    )


def parallelism_changes(ns: argparse.Namespace, cfg: LaunchConfig) -> None:
    names = (*_PARALLELISM_SIZES, "cp_backend", "cp_comm_strategy")
    given = {
        f"parallelism_config_{k}": getattr(ns, f"parallelism_config_{k}", None)
        for k in names
        if getattr(ns, f"parallelism_config_{k}", None) is not None
    }
    if given or getattr(ns, "use_parallelism_config", False):
        current = cfg.extras.get("parallelism_config") or {}
        # an empty mapping still turns the layout on: every size 1 (plain data parallel) unless given
        merged = {**current, **given} or {"parallelism_config_dp_replicate_size": 1}
        cfg.extras = {**cfg.extras, "parallelism_config": merged}
