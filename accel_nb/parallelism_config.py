"""Shim at the reference's ``accelerate.parallelism_config`` path; the code lives in accel_nb.parallel.config."""

from __future__ import annotations

from .parallel.config import ParallelismConfig, TorchContextParallelConfig, TorchTensorParallelConfig

__all__ = ["ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig"]
