"""The environment the ranks of an ``accel-nb launch`` get, from its parsed arguments.

``prepare_multi_gpu_env`` is the reference's name (``accelerate.utils.launch``) for this: it takes
the arguments ``accel-nb launch`` (or ``accelerate launch``) parsed and returns the environment
torchrun hands to every rank, built from the same config as ``accel-nb launch`` itself.

    ns = build_parser().parse_args(["launch", "--num_processes", "2", "--mixed_precision", "bf16", "train.py"])
    env = prepare_multi_gpu_env(ns)     # env["ACCELERATE_MIXED_PRECISION"] == "bf16"; ns.nproc_per_node == "2"
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..config import LaunchConfig
from ..launch.elastic.rendezvous import main_endpoint
from .launch import config_for_launch, rank_environment
from .launch_flags import FSDP_FLAGS

__all__ = ["prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env"]

# what config_for_launch reads from the namespace (the reference's namespace has each of them too)
_LAUNCH_FLAGS = (
    "config_file",
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "mixed_precision",
    "gradient_accumulation_steps",
    "gpu_ids",
    "cpu",
    "max_restarts",
    "rdzv_backend",
    "use_deepspeed",
)
_DYNAMO = ("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")


# the reference's FSDP_* variables (what transformers and the reference's ranks read): flag -> variable
_FSDP_VARIABLES = {
    **{
        f"fsdp_{n}": f"FSDP_{n.upper()}"
        for n in (
            "version",
            "sharding_strategy",
            "reshard_after_forward",
            "offload_params",
            "min_num_params",
            "auto_wrap_policy",
            "backward_prefetch",
            "state_dict_type",
            "forward_prefetch",
            "use_orig_params",
            "cpu_ram_efficient_loading",
            "sync_module_states",
            "activation_checkpointing",
            "activation_checkpointing_offload",
            "ignored_modules",
        )
    },
    "fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
}


def _fsdp_variables(given: dict[str, Any]) -> dict[str, str]:
    """The reference's ``FSDP_*`` variables for the ``--fsdp_*`` flags given (true/false in lower case)."""
    out = {}
    for flag, variable in _FSDP_VARIABLES.items():
        value = given.get(flag)
        if value is not None:
            text = str(value)
            out[variable] = text.lower() if text.lower() in ("true", "false") else text
    return out


def _as_flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment every rank of a launch with these parsed arguments gets: ``os.environ`` plus the launch's values.

        env = prepare_multi_gpu_env(args)     # args: what `accel-nb launch` or `accelerate launch` parsed

    As in the reference, ``args`` is filled with torchrun's names for the same launch
    (``nproc_per_node``, ``nnodes``, ``node_rank``, ``master_addr``/``master_port`` or
    ``rdzv_endpoint``) and ``main_process_port=0`` becomes a free port. The values come from the
    saved config where a flag is absent, exactly as ``accel-nb launch`` reads them; the reference's
    ``--dynamo_*``, ``--use_fsdp``/``--fsdp_*``, ``--num_cpu_threads_per_process``, ``--debug``,
    ``--multi_gpu`` and ``--same_network`` flags are honoured when present. Deliberate difference: with
    no port given on one machine the port is a free one, not 29500 (docs/migration.md). An unusable
    value raises the config's error naming the flag.
    """
    given = vars(args)
    view = argparse.Namespace(**{**dict.fromkeys(_LAUNCH_FLAGS), **given})
    port = given.get("main_process_port")
    if port is not None and int(port) == 0:
        view.main_process_port = None  # "pick a free port", as in the reference
    if isinstance(view.mixed_precision, str):
        view.mixed_precision = view.mixed_precision.lower()
    cfg = config_for_launch(view)
    changes: dict[str, Any] = {}
    if given.get("multi_gpu"):  # the reference's --multi_gpu: GPU processes even where the config says CPU
        changes.update(distributed_type="MULTI_GPU", use_cpu=False)
    if given.get("same_network") is not None:
        changes["same_network"] = bool(given["same_network"])
    if given.get("dynamo_backend") is not None:
        changes["dynamo_backend"] = str(given["dynamo_backend"]).lower()
        for name in _DYNAMO:
            if given.get(name) is not None:
                changes[name] = _as_flag(given[name]) if name != "dynamo_mode" else given[name]
    if given.get("use_fsdp"):
        if _as_flag(given.get("fsdp_cpu_ram_efficient_loading")) and not _as_flag(
            given.get("fsdp_sync_module_states")
        ):
            raise ValueError(
                "--fsdp_cpu_ram_efficient_loading needs --fsdp_sync_module_states true (the other processes "
                "receive the weights process 0 loaded)"
            )
        fsdp = {k: given[k] for k in FSDP_FLAGS if given.get(k) is not None}
        changes["distributed_type"] = "FSDP"
        cfg.extras = {**cfg.extras, "fsdp_config": {**(cfg.extras.get("fsdp_config") or {}), **fsdp}}
    if changes:
        cfg = cfg.replace(**changes)
    addr, chosen_port = main_endpoint(cfg)
    nproc = cfg.processes_here()
    args.main_process_port = chosen_port
    args.nproc_per_node = str(nproc)
    if cfg.num_machines > 1:
        args.nnodes, args.node_rank = str(cfg.num_machines), cfg.machine_rank
        if cfg.same_network:
            args.master_addr, args.master_port = str(addr), str(chosen_port)
        else:
            args.rdzv_endpoint = f"{addr}:{chosen_port}"
    else:
        args.master_port = str(chosen_port)
    device = "CPU" if cfg.use_cpu or cfg.distributed_type == "MULTI_CPU" else "GPU"
    env = dict(os.environ)
    env.update(rank_environment(cfg, addr, device, given.get("log_line_prefix_template")))
    if given.get("num_cpu_threads_per_process") is not None:
        env["OMP_NUM_THREADS"] = str(given["num_cpu_threads_per_process"])
    if given.get("debug"):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if given.get("use_fsdp"):  # accel_nb's ranks read ACCEL_NB_FSDP_CONFIG; other libraries read these
        env.update(_fsdp_variables(given))
    return env


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The reference's one-process launch of parsed ``args``: ``(command, environment)``, nothing started.

        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--cpu", "train.py"]))
        cmd, env = prepare_simple_launcher_cmd_env(args)    # [python, train.py], env["KMP_BLOCKTIME"] == "1"

    The command runs the script with this Python (``--module``: ``-m``; ``--no_python``: as given). With an
    ``mpirun_hostfile`` (the config's ``mpirun_config``) it is the ``mpirun`` line the reference would run
    (``accel_nb.utils.launch.mpirun_arguments`` reads which MPI is installed); ``accel-nb launch`` itself refuses
    mpirun. The environment is ``os.environ`` with the config's values (accel_nb's and the reference's names),
    Intel OpenMP's ``KMP_*`` settings for CPU runs, and ``OMP_NUM_THREADS``.
    """
    from ..utils.launch import (
        mpirun_arguments,
    )  # deferred: import time (the reference's path, patched by tests)

    if getattr(args, "no_python", False) and getattr(args, "module", False):
        raise ValueError("--module and --no_python exclude each other: give one")
    processes, machines = getattr(args, "num_processes", None), getattr(args, "num_machines", None) or 1
    cmd: list[str] = []
    hostfile = getattr(args, "mpirun_hostfile", None)
    if hostfile is not None:
        app, hostfile_flag, count_flag, per_node_flag, bind_flag = mpirun_arguments()
        per_node = str(processes // machines) if processes else "1"
        cmd += [app, hostfile_flag, hostfile, per_node_flag, per_node]
        if processes:
            cmd += [count_flag, str(processes)]
        if bind_flag:
            cmd += [bind_flag, "socket"]
    if not getattr(args, "no_python", False):
        cmd += [sys.executable, "-m"] if getattr(args, "module", False) else [sys.executable]
    cmd += [args.training_script, *args.training_script_args]
    use_cpu = bool(getattr(args, "cpu", False) or getattr(args, "use_cpu", False))
    if machines > 1 and (args.main_process_ip is None or args.main_process_port is None):
        raise ValueError(
            "several machines need --main_process_ip and --main_process_port (the address of machine 0)"
        )
    cfg = LaunchConfig(
        mixed_precision=(args.mixed_precision or "no").lower(),
        use_cpu=use_cpu,
        gpu_ids=getattr(args, "gpu_ids", None) or "all",
        dynamo_backend=str(getattr(args, "dynamo_backend", None) or "no").lower(),
        dynamo_mode=getattr(args, "dynamo_mode", None) or "default",
        dynamo_use_fullgraph=_as_flag(getattr(args, "dynamo_use_fullgraph", False)),
        dynamo_use_dynamic=_as_flag(getattr(args, "dynamo_use_dynamic", False)),
        dynamo_use_regional_compilation=_as_flag(getattr(args, "dynamo_use_regional_compilation", False)),
    ).validate()
    env = dict(os.environ)
    env.update(cfg.to_env())
    env["ACCELERATE_USE_CPU"] = str(use_cpu)
    if getattr(args, "debug", False):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if (processes is not None and processes > 1) or machines > 1:
        env["MASTER_ADDR"] = args.main_process_ip or "127.0.0.1"
        env["MASTER_PORT"] = str(args.main_process_port or 29500)
    if use_cpu:  # Intel OpenMP: pin threads compactly, short spin before sleeping
        env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
    threads = getattr(args, "num_cpu_threads_per_process", None)
    env["OMP_NUM_THREADS"] = str(threads if threads is not None else os.environ.get("OMP_NUM_THREADS", "1"))
    return cmd, env
