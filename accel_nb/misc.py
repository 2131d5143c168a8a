"""Small general helpers code written for the reference library calls: seeding, save on the main process,
kernel check, ports, byte counts, nested dicts and attributes, the utils' ``reduce`` and ``wait_for_everyone``.

    save(model.state_dict(), "weights.safetensors", safe_serialization=True)   # main process only
    check_os_kernel()                # warns on a Linux kernel older than 5.5 (hangs have been seen there)
    merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}})   # {'a': {'c': 2, 'b': 1}}
"""

from __future__ import annotations

import functools
import platform
import random
import re
import socket
from collections import OrderedDict
from typing import Any

__all__ = [
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "convert_bytes",
    "get_free_port",
    "get_pretty_name",
    "is_port_in_use",
    "load",
    "merge_dicts",
    "recursive_getattr",
    "reduce",
    "save",
    "set_seed",
    "tqdm",
    "wait_for_everyone",
]

_MIN_KERNEL = "5.5.0"


def check_os_kernel() -> None:
    """Log a warning (main process) when Linux runs a kernel older than 5.5.0; nothing elsewhere."""
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    from packaging.version import Version

    version = found.group(0)
    if Version(version) < Version(_MIN_KERNEL):
        from .logging import get_logger

        get_logger(__name__).warning(
            f"Detected kernel version {version}, which is below the recommended minimum of {_MIN_KERNEL}; this "
            "can cause the process to hang. It is recommended to upgrade the kernel to the minimum version or higher.",
            main_process_only=True,
        )


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each storage kept under its first name only (safetensors refuses shared
    storage) and every tensor made contiguous; the names left out are logged as a warning."""
    import torch

    from .big_model.module_helpers import id_tensor_storage

    seen: set[Any] = set()
    removed: list[str] = []
    cleaned = type(state_dict)() if isinstance(state_dict, OrderedDict) else {}
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor):
            storage = id_tensor_storage(value)
            if value.device.type != "meta" and storage in seen:
                removed.append(name)
                continue
            seen.add(storage)
            value = value.contiguous()
        cleaned[name] = value
    if removed:
        from .logging import get_logger

        # the reference's words first: code and tests match on them
        get_logger(__name__).warning(
            f"Removed shared tensor {set(removed)} while saving. This should be OK, but check by verifying that "
            "you don't receive any warning while reloading (these names share their storage with a tensor saved "
            "under another name, e.g. tied weights)"
        )
    return cleaned


def save(obj: Any, f: Any, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors' ``save_file`` with ``safe_serialization``) on the main process only,
    or on each machine's local main process with ``save_on_each_node``."""
    import torch

    from .state import PartialState

    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if safe_serialization:
        from safetensors.torch import save_file

        if isinstance(obj, OrderedDict):
            obj = clean_state_dict_for_safetensors(obj)
        save_file(obj, f, metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless asked otherwise (numpy arrays and RNG states allowed)."""
    import numpy as np
    import torch

    kwargs.setdefault("weights_only", True)
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(f, map_location=map_location, **kwargs)


def get_pretty_name(obj: Any) -> str:
    """``obj``'s qualified name, its class's for an instance, else ``str(obj)``."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    for attr in ("__qualname__", "__name__"):
        if hasattr(obj, attr):
            return getattr(obj, attr)
    return str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Copy ``source`` into ``destination`` (in place, returned), merging nested dicts key by key."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``recursive_getattr(model, "encoder.layer.0")`` is ``model.encoder.layer[0]`` read by attribute names."""
    return functools.reduce(getattr, attr.split("."), obj)


def convert_bytes(size: float) -> str:
    """``1536`` -> ``'1.5 KB'`` (1024-based units named as the reference names them)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def is_port_in_use(port: int | None = None) -> bool:
    """True when something accepts connections on ``localhost:port`` (default 29500)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("localhost", 29500 if port is None else port)) == 0


def get_free_port() -> int:
    """A TCP port the OS reports free right now (it may be taken by the time it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(...)`` shown on each machine's local main process only (unless ``main_process_only=False``).

    for batch in tqdm(loader, desc="eval"): ...
    accel_nb's own live progress for every process is ``accel_nb.progress`` (progress.md).
    """
    from .availability import is_tqdm_available

    if not is_tqdm_available():
        raise ImportError(
            "Accelerate's `tqdm` module requires `tqdm` to be installed. Please run `pip install tqdm`."
        )
    if args and isinstance(args[0], bool):
        raise ValueError(
            "Passing `True` or `False` as the first argument to Accelerate's `tqdm` wrapper is unsupported. "
            "Please use the `main_process_only` keyword argument instead."
        )
    from tqdm.auto import tqdm as auto_tqdm

    from .state import PartialState

    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = PartialState().local_process_index != 0
    return auto_tqdm(*args, **kwargs, disable=disable)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices). ``device_specific`` adds the process index;
    ``deterministic`` also makes torch use deterministic algorithms (``torch.use_deterministic_algorithms``;
    slower, and an operation without one raises).

    set_seed(42)
    """
    import numpy as np
    import torch

    if device_specific:
        from .state import PartialState

        seed += PartialState().process_index
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def wait_for_everyone() -> None:
    """Block until every process of the run reaches this line (nothing to wait for in one process).

    wait_for_everyone()
    """
    from .state import PartialState

    PartialState().wait_for_everyone()


def reduce(tensor: object, reduction: str = "mean", scale: float = 1.0) -> object:
    """``accel_nb.reduce`` with the default of the reference's ``utils.reduce``: the mean over processes.

    loss = reduce(loss)            # mean; reduce(loss, "sum") sums, as Accelerator.reduce does by default
    """
    from .ops import reduce as reduce_across_processes

    return reduce_across_processes(tensor, reduction, scale)
