"""Small helpers shared by the whole package, and the reference library's ``accelerate.utils`` path.

Defined here: seeding, sizes, kernel detection (nothing heavy is imported at module level).
Every other name of the reference's ``utils`` resolves on first use, and each of its submodule
paths is a shim here (``accel_nb.utils.operations``, ``accel_nb.utils.modeling``, ...).

    from accel_nb.utils import set_seed, gather, find_executable_batch_size
    from accel_nb.utils.operations import pad_across_processes
"""

from __future__ import annotations

import importlib
import random as _random
import re
import sys
from types import ModuleType

from ..lazy_exports import lazy_exports

_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def set_seed(seed: int, device_specific: bool = False) -> None:
    """Seed python, numpy and torch (all devices). ``device_specific`` adds the process index.

    set_seed(42)
    """
    import numpy as np
    import torch

    if device_specific:
        from ..state import PartialState

        seed += PartialState().process_index
    _random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def imported_module(name: str) -> ModuleType | None:
    """The module ``name`` if this process has imported it, else None; never starts an import.

    A module another thread is still importing (accel_nb warms torch in the background after
    the first launch) is waited for, so callers never see a half-initialised torch.

        torch = imported_module("torch")
    """
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        module = importlib.import_module(name)  # blocks until the other thread's import is done
    return module


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def in_ipython_kernel() -> bool:
    """True in a Jupyter kernel (its shell or a subclass, e.g. Colab's), checked without importing IPython.

    in_ipython_kernel()   # False in a script or a plain terminal IPython
    """
    import sys

    ipython_mod = sys.modules.get("IPython")
    if ipython_mod is None:  # IPython not even loaded: certainly no kernel
        return False
    try:
        shell = ipython_mod.get_ipython()
    except AttributeError:  # a half-imported or stand-in IPython module
        return False
    return shell is not None and any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__)


def parse_size(value: int | float | str, *, what: str = "size", positive: bool = False) -> int:
    """Bytes in a size: 1024, '500MB' (10**6 based), '2GiB' (2**30 based).

    parse_size("10GB")   # 10_000_000_000
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a size; use bytes (int) or a string like '10GiB'")
    if isinstance(value, (int, float)):
        result = int(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or (unit and unit not in _SIZE_UNITS):
            raise ValueError(
                f"cannot read {what} {value!r}; use bytes (int) or a size like '10GB', '500MB', '2GiB'"
            )
        result = int(float(match.group(1)) * _SIZE_UNITS[unit or "b"])
    if result < 0 or (positive and result == 0):
        raise ValueError(f"{what} must be {'positive' if positive else 'zero or more'}, got {value!r}")
    return result


def wait_for_everyone() -> None:
    """Block until every process of the run reaches this line (nothing to wait for in one process).

    wait_for_everyone()
    """
    from ..state import PartialState

    PartialState().wait_for_everyone()


def reduce(tensor: object, reduction: str = "mean", scale: float = 1.0) -> object:
    """``accel_nb.reduce`` with the default of the reference's ``utils.reduce``: the mean over processes.

    loss = reduce(loss)            # mean; reduce(loss, "sum") sums, as Accelerator.reduce does by default
    """
    from ..ops import reduce as reduce_across_processes

    return reduce_across_processes(tensor, reduction, scale)


# The reference library's ``utils`` module path: each name is the one implementation elsewhere in
# accel_nb, imported on first use (``import accel_nb.utils`` stays light).
_REFERENCE_PATHS: dict[str, str] = {
    **dict.fromkeys(["DistributedType", "PartialState", "AcceleratorState", "GradientState"], "..state"),
    **dict.fromkeys(
        [
            "gather", "gather_object", "broadcast", "broadcast_object_list", "pad_across_processes",
            "send_to_device", "recursively_apply",
        ],
        "..ops",
    ),
    "ProjectConfiguration": "..checkpoint",
    "DataLoaderConfiguration": "..data",
    **dict.fromkeys(
        [
            "AutocastKwargs", "DDPCommunicationHookType", "DistributedDataParallelKwargs", "GradScalerKwargs",
            "GradientAccumulationPlugin", "InitProcessGroupKwargs", "KwargsHandler", "ProfileKwargs",
        ],
        "..kwargs_handlers",
    ),
    **dict.fromkeys(
        ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"], "..memory"
    ),
    **dict.fromkeys(["patch_environment", "clear_environment"], "..environment"),
    "write_basic_config": "..config.basic",
    **dict.fromkeys(["FSDPOptions", "FullyShardedDataParallelPlugin"], "..fsdp"),
    "LoggerType": "..tracking",
    **dict.fromkeys(["RNGType", "synchronize_rng_state", "synchronize_rng_states"], "..data.random_sync"),
    **dict.fromkeys(["extract_model_from_parallel", "is_compiled_module"], "..accelerator.unwrap"),
    **dict.fromkeys(["TorchDynamoPlugin", "DynamoBackend"], "..compile.options"),
    **dict.fromkeys(["compile_regions", "has_compiled_regions"], "..compile.apply"),
    **dict.fromkeys(
        [
            "find_tied_parameters", "load_state_dict", "named_module_tensors", "set_module_tensor_to_device",
        ],
        "..big_model.module_tensors",
    ),
    "get_state_dict_offloaded_model": "..big_model.module_helpers",
    **dict.fromkeys(
        [
            "check_device_map", "compute_module_sizes", "get_balanced_memory", "get_max_memory",
            "infer_auto_device_map", "load_checkpoint_in_model",
        ],
        "..big_model",
    ),
}  # fmt: skip


# the reference's submodules of ``utils``: each a shim module here; their names resolve from this
# package too (``accel_nb.utils.listify``), as in the reference
_SHIMS = ("bnb", "constants", "dataclasses", "deepspeed", "environment", "imports", "memory", "modeling", "offload",
          "operations", "other", "random", "tqdm", "versions")  # fmt: skip
for _shim in _SHIMS:
    for _name in importlib.import_module(f".{_shim}", __name__).__all__:
        _REFERENCE_PATHS.setdefault(_name, f".{_shim}")
del _shim, _name
# as in the reference, ``accel_nb.utils.tqdm`` is the function; its module stays importable by its path
del globals()["tqdm"]

__getattr__, __dir__ = lazy_exports(globals(), _REFERENCE_PATHS)
