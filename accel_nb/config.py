"""The launch config: one dataclass, validated, stored as YAML in a per-user directory.

The file uses the key names and values of the reference library's ``default_config.yaml``
(``distributed_type: MULTI_GPU``, ``mixed_precision: bf16``, ``gpu_ids: all`` ...), so a config
written for it loads here unchanged. ``accel-nb config``, ``config_wizard()``, ``accel-nb launch``,
``notebook_launcher`` and ``%%accelerate`` all read the same file.

This module is the public face; the work is done in ``config_values`` (allowed values, checks,
errors), ``launch_config`` (the dataclass) and ``config_files`` (paths, YAML, atomic writes).

    from accel_nb.config import load_config, save_config, default_config
    cfg = load_config() or default_config()      # the saved config, else one for this machine
    cfg.num_processes = 2
    save_config(cfg)                             # validated first, written atomically
"""

from __future__ import annotations

from .config_files import (
    default_config_path,
    find_config_file,
    load_config,
    reference_config_path,
    save_config,
)
from .config_values import (
    COMPUTE_ENVIRONMENTS,
    CONFIG_FILE_ENV,
    CONFIG_FILE_NAME,
    DISTRIBUTED_TYPES,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    MIXED_PRECISIONS,
    RDZV_BACKENDS,
    REFERENCE_KEYS_KEPT,
    START_METHODS,
    ConfigError,
    ConfigFileError,
    ConfigWarning,
)
from .hardware import HardwareInfo, detect
from .launch_config import LaunchConfig

__all__ = [
    "COMPUTE_ENVIRONMENTS", "CONFIG_FILE_ENV", "CONFIG_FILE_NAME", "DISTRIBUTED_TYPES", "DYNAMO_BACKENDS",
    "DYNAMO_MODES", "MIXED_PRECISIONS", "RDZV_BACKENDS", "REFERENCE_KEYS_KEPT", "START_METHODS", "ConfigError",
    "ConfigFileError", "ConfigWarning", "LaunchConfig", "default_config", "default_config_path",
    "derive_distributed_type", "find_config_file", "load_config", "reference_config_path", "save_config",
]  # fmt: skip

COMPUTE_KINDS = ("cpu", "gpu", "xla")


def default_config(hw: HardwareInfo | None = None) -> LaunchConfig:
    """A sensible config for this machine: one process per GPU (bf16 where supported), else 1 CPU process.

    cfg = default_config()
    """
    hw = hw or detect()
    if hw.num_gpus:
        if hw.bf16_gpus:
            mp = "bf16"
        elif all(g.compute_capability >= (7, 0) for g in hw.gpus):
            mp = "fp16"
        else:
            mp = "no"
        dt = "MULTI_GPU" if hw.num_gpus > 1 else "NO"
        return LaunchConfig(distributed_type=dt, num_processes=hw.num_gpus, mixed_precision=mp).validate()
    if hw.tpu_detected and hw.xla_available:
        n = hw.xla_runtime.num_devices if hw.xla_runtime is not None else None  # one process per TPU device
        return LaunchConfig(distributed_type="XLA", num_processes=n, mixed_precision="bf16").validate()
    return LaunchConfig(distributed_type="NO", num_processes=1, mixed_precision="no", use_cpu=True).validate()


def derive_distributed_type(cfg: LaunchConfig, compute: str) -> str:
    """The ``distributed_type`` for ``cfg``'s process and machine counts on ``compute`` (cpu, gpu or xla).

    derive_distributed_type(LaunchConfig(num_processes=2), "gpu")   # 'MULTI_GPU'

    A config that shards with FSDP keeps ``FSDP`` while it has several processes.
    """
    if compute not in COMPUTE_KINDS:
        raise ValueError(f"compute={compute!r} is not one of {', '.join(COMPUTE_KINDS)}")
    if compute == "xla":
        return "XLA"
    several = int(cfg.num_processes or 1) > 1 or int(cfg.num_machines) > 1
    if not several:
        return "NO"
    if cfg.distributed_type == "FSDP":  # sharding chosen earlier (its fsdp_config stays with it)
        return "FSDP"
    return "MULTI_GPU" if compute == "gpu" else "MULTI_CPU"
