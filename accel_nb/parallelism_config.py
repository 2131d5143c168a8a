"""Shim at the reference's ``accelerate.parallelism_config`` path; the code lives in accel_nb.parallel.config."""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .parallel.config import ParallelismConfig, TorchContextParallelConfig, TorchTensorParallelConfig
from .reexports import reexports

__all__ = ["ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig"]


# the names the reference's module at this path has because it imports them (accel_nb.reexports)
__getattr__, __dir__ = lazy_exports(globals(), reexports(__name__))
