"""accel_nb: device-agnostic PyTorch training and big-model inference, launched from a notebook.

The public API, nothing else. Every name is resolved lazily on first use, so ``import accel_nb``
costs little more than ``import torch`` and never pulls in IPython, ipywidgets or torch_xla.

    from accel_nb import Accelerator, notebook_launcher
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .lazy_exports import lazy_exports

__version__ = "0.1.0"

# public name -> module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # state
    "PartialState": ".state",
    "AcceleratorState": ".state",
    "GradientState": ".state",
    "DistributedType": ".state",
    # ops
    "gather": ".ops",
    "gather_object": ".ops",
    "broadcast": ".ops",
    "broadcast_object_list": ".ops",
    "reduce": ".ops",
    "pad_across_processes": ".ops",
    "send_to_device": ".ops",
    # training core
    "Accelerator": ".accelerator",
    "skip_first_batches": ".data",
    "ProjectConfiguration": ".checkpoint",
    "CheckpointError": ".serialization",
    "DataLoaderConfiguration": ".data",
    "CompileOptions": ".compile",
    "set_seed": ".misc",
    # progress inside a launch
    "progress": ".progress_bar",
    # launching (notebook face)
    "notebook_launcher": ".notebook.launcher",
    "debug_launcher": ".notebook.launcher",
    "Session": ".notebook.session_view",
    "LaunchError": ".launch.errors",
    "RankFailure": ".launch.errors",
    # config / hardware
    "LaunchConfig": ".config",
    "FSDPOptions": ".fsdp",
    "FullyShardedDataParallelPlugin": ".fsdp",
    "ParallelismConfig": ".parallel",
    "DeepSpeedPlugin": ".deepspeed",
    "config_wizard": ".notebook.wizard",
    # big-model inference
    "init_empty_weights": ".big_model",
    "init_on_device": ".big_model",
    "compute_module_sizes": ".big_model",
    "get_max_memory": ".big_model",
    "get_balanced_memory": ".big_model",
    "infer_auto_device_map": ".big_model",
    "load_checkpoint_in_model": ".big_model",
    "dispatch_model": ".big_model",
    "load_checkpoint_and_dispatch": ".big_model",
    "cpu_offload": ".big_model",
    "disk_offload": ".big_model",
    "show_device_map": ".notebook.device_map_view",
    # pipeline parallel
    "prepare_pippy": ".parallel.pipeline",
    "PipelineTrainer": ".parallel.pipeline_training",
    # the reference library's other top-level names (also under accel_nb.utils / accel_nb.hooks)
    "AutocastKwargs": ".kwargs_handlers",
    # FP8 recipes (accel_nb.precision.fp8_recipes; the reference has them under accelerate.utils)
    "AORecipeKwargs": ".precision.fp8_recipes",
    "FP8RecipeKwargs": ".precision.fp8_recipes",
    "MSAMPRecipeKwargs": ".precision.fp8_recipes",
    "TERecipeKwargs": ".precision.fp8_recipes",
    "DDPCommunicationHookType": ".kwargs_handlers",
    "DistributedDataParallelKwargs": ".kwargs_handlers",
    "GradScalerKwargs": ".kwargs_handlers",
    "InitProcessGroupKwargs": ".kwargs_handlers",
    "ProfileKwargs": ".kwargs_handlers",
    "find_executable_batch_size": ".memory",
    "synchronize_rng_states": ".data.random_sync",
    "cpu_offload_with_hook": ".big_model.model_hooks",
    "is_rich_available": ".availability",
}

__all__ = sorted(_EXPORTS) + ["__version__", "load_ipython_extension"]


__getattr__ = lazy_exports(globals(), _EXPORTS)[0]


def __dir__() -> list[str]:
    return __all__


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext accel_nb``: register the ``%%accelerate`` magics in this IPython session."""
    from .notebook.magics import load_ipython_extension as _load  # deferred: import time

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .notebook.magics import unload_ipython_extension as _unload  # deferred: import time

    _unload(ipython)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .accelerator import Accelerator
    from .big_model import (
        compute_module_sizes,
        cpu_offload,
        disk_offload,
        dispatch_model,
        get_balanced_memory,
        get_max_memory,
        infer_auto_device_map,
        init_empty_weights,
        init_on_device,
        load_checkpoint_and_dispatch,
        load_checkpoint_in_model,
    )
    from .checkpoint import ProjectConfiguration
    from .compile import CompileOptions
    from .config import LaunchConfig
    from .data import DataLoaderConfiguration, skip_first_batches
    from .deepspeed import DeepSpeedPlugin
    from .fsdp import FSDPOptions
    from .launch.errors import LaunchError, RankFailure
    from .misc import set_seed
    from .notebook.device_map_view import show_device_map
    from .notebook.launcher import debug_launcher, notebook_launcher
    from .notebook.session_view import Session
    from .notebook.wizard import config_wizard
    from .ops import (
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
        send_to_device,
    )
    from .parallel import ParallelismConfig
    from .progress_bar import progress
    from .serialization import CheckpointError
    from .state import AcceleratorState, DistributedType, GradientState, PartialState
