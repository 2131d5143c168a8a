"""The launch config a machine gets when none is saved, and the ``distributed_type`` a compute choice implies.

    cfg = default_config()                                  # one process per GPU, else one CPU process
    derive_distributed_type(cfg.replace(num_processes=2), "cpu")   # 'MULTI_CPU'

The wizard, ``accel-nb config`` and ``write_basic_config`` all start from ``default_config()``.
"""

from __future__ import annotations

from ..accelerator.backends import launch_backend
from ..hardware import HardwareInfo, detect
from .launch_config import LaunchConfig

__all__ = ["COMPUTE_KINDS", "default_config", "derive_distributed_type"]

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

    A config that shards with FSDP keeps ``FSDP`` while it has several processes; one that trains with
    DeepSpeed keeps ``DEEPSPEED`` on CPU and GPU (one process too: ZeRO offload on a single GPU).
    """
    if compute not in COMPUTE_KINDS:
        raise ValueError(f"compute={compute!r} is not one of {', '.join(COMPUTE_KINDS)}")
    if compute == "xla":
        return "XLA"
    several = int(cfg.num_processes or 1) > 1 or int(cfg.num_machines) > 1
    # a back-end chosen earlier keeps its type (its section stays with it): DeepSpeed always, FSDP while several
    if launch_backend(cfg.distributed_type).keeps_distributed_type(several):
        return cfg.distributed_type
    if not several:
        return "NO"
    return "MULTI_GPU" if compute == "gpu" else "MULTI_CPU"
