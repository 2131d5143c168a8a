"""Training back-ends: one class per way of spreading a model over the processes, chosen once per Accelerator.

- ``base``: the interface (``TrainingBackend``), its registry (``register_backend``, ``launch_backend``) and
  the model conversions a precision registers (``ModelConversion``, FP8 next); how to add one is written there
- ``ddp``: one process, or DistributedDataParallel · ``fsdp``: FSDP2 · ``deepspeed``: DeepSpeed ZeRO ·
  ``layout``: the TP/CP/PP layout on a device mesh · ``xla``: XLA devices
- ``fp8``: FP8 training (torchao's float8 layers), a model conversion; its logic is ``accel_nb.precision.fp8``
- ``selection``: which one an Accelerator runs (``choose_backend``; it imports torch, so it is not imported here)

Importing this package registers every back-end without importing torch: ``accel_nb.config`` reads the
launch parts (``launch_backend(cfg.distributed_type).launch_env(cfg)``).

    from accel_nb.accelerator.backends import BACKENDS
    list(BACKENDS)          # ['ddp', 'deepspeed', 'fsdp', 'layout', 'xla']
"""

from __future__ import annotations

from . import ddp, deepspeed, fp8, fsdp, layout, megatron, xla  # registration, in this order
from .base import (
    BACKENDS,
    CONVERSIONS,
    ModelConversion,
    TrainingBackend,
    backend_named,
    conversions_for,
    launch_backend,
    register_backend,
    register_conversion,
)

__all__ = [
    "BACKENDS",
    "CONVERSIONS",
    "ModelConversion",
    "TrainingBackend",
    "backend_named",
    "conversions_for",
    "ddp",
    "deepspeed",
    "fp8",
    "fsdp",
    "launch_backend",
    "layout",
    "megatron",
    "register_backend",
    "register_conversion",
    "xla",
]
