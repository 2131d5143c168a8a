"""What this Python environment has: optional packages, torch features, accelerator kinds, versions,
the modules this process has imported, whether it is a Jupyter kernel.

    is_transformers_available()             # True when `import transformers` would find the package
    is_torch_version(">=", "2.4")           # compares the installed torch
    compare_versions("numpy", "<", "3")     # a package name or a parsed version

Each check looks, it never imports the package it asks about (except torch, already imported by
callers that care) and never starts a device.
"""

from __future__ import annotations

import importlib
import importlib.util
import operator
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = [
    "compare_versions",
    "imported_module",
    "in_ipython_kernel",
    "is_torch_version",
    "package_available",
    "STR_OPERATION_TO_FUNC",
]

# how compare_versions reads an operation; the reference's accelerate.utils.constants name
STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


def package_available(module: str, *distributions: str) -> bool:
    """True when ``module`` can be imported and one of ``distributions`` (default: ``module``) is installed.

    package_available("yaml", "PyYAML")
    """
    if importlib.util.find_spec(module) is None:
        return False
    from importlib import (
        metadata,  # deferred: import time (it pulls email, zipfile, csv; the launch path never asks)
    )

    for dist in distributions or (module,):
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            continue
    return False


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """``version(library_or_version) <operation> requirement_version``; a name is looked up as an installed package.

    compare_versions("torch", ">=", "2.2")
    """
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(
            f"`operation` must be one of {list(STR_OPERATION_TO_FUNC.keys())}, received {operation}"
        )
    from importlib import metadata  # deferred: import time (see package_available)

    from packaging.version import parse

    if isinstance(library_or_version, str):
        library_or_version = parse(metadata.version(library_or_version))
    return STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """``installed torch <operation> version`` (local build tags such as ``+cpu`` count as in packaging)."""
    import torch
    from packaging.version import parse

    return compare_versions(parse(torch.__version__), operation, version)


def _package_check(module: str, *distributions: str, doc: str = "") -> Callable[[], bool]:
    def check() -> bool:
        return package_available(module, *distributions)

    check.__doc__ = (
        doc or f"True when the ``{distributions[0] if distributions else module}`` package is installed."
    )
    return check


# one line per optional package the reference library asks about: (function name, module, distributions)
_PACKAGES = [
    ("is_import_timer_available", "import_timer"),
    ("is_pynvml_available", "pynvml", "pynvml", "nvidia-ml-py"),
    ("is_amdsmi_available", "amdsmi"),
    ("is_pytest_available", "pytest"),
    ("is_msamp_available", "msamp", "ms-amp"),
    ("is_schedulefree_available", "schedulefree"),
    ("is_lomo_available", "lomo_optim"),
    ("is_deepspeed_available", "deepspeed"),
    ("is_torchvision_available", "torchvision"),
    ("is_transformers_available", "transformers"),
    ("is_datasets_available", "datasets"),
    ("is_peft_available", "peft"),
    ("is_timm_available", "timm"),
    ("is_triton_available", "triton"),
    ("is_wandb_available", "wandb"),
    ("is_comet_ml_available", "comet_ml"),
    ("is_swanlab_available", "swanlab"),
    ("is_trackio_available", "trackio"),
    ("is_boto3_available", "boto3"),
    ("is_sagemaker_available", "sagemaker"),
    ("is_tqdm_available", "tqdm"),
    ("is_clearml_available", "clearml"),
    ("is_pandas_available", "pandas"),
    ("is_matplotlib_available", "matplotlib"),
    ("is_dvclive_available", "dvclive"),
    ("is_torchdata_available", "torchdata"),
]
for _name, _module, *_dists in _PACKAGES:
    globals()[_name] = _package_check(_module, *_dists)
    globals()[_name].__name__ = globals()[_name].__qualname__ = _name
    __all__.append(_name)


def _installed_at_least(distribution: str, minimum: str | None) -> bool:
    """``distribution`` importable and, when ``minimum`` is given, installed at that version or newer."""
    if not package_available(distribution):
        return False
    return minimum is None or compare_versions(distribution, ">=", minimum)


def is_bnb_available(min_version: str | None = None) -> bool:
    """True when bitsandbytes is installed (at ``min_version`` or newer, when given)."""
    return _installed_at_least("bitsandbytes", min_version)


def is_8bit_bnb_available() -> bool:
    """True when the installed bitsandbytes has 8-bit layers (0.37.2 or newer)."""
    return _installed_at_least("bitsandbytes", "0.37.2")


def is_4bit_bnb_available() -> bool:
    """True when the installed bitsandbytes has 4-bit layers (0.39.0 or newer)."""
    return _installed_at_least("bitsandbytes", "0.39.0")


def is_bitsandbytes_multi_backend_available() -> bool:
    """True when the installed bitsandbytes says it has its multi-backend preview (``bnb.features``), as the
    reference asks; current bitsandbytes releases run on CPU without it (and answer False)."""
    if not is_bnb_available():
        return False
    import bitsandbytes  # deferred: heavy, and only asked for here

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_torchao_available() -> bool:
    """True when torchao 0.6.1 or newer is installed (accel_nb's torchao quantization path)."""
    return _installed_at_least("torchao", "0.6.1")


def torchao_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``func`` raises ImportError naming torchao when torchao is not installed."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(f"{func.__name__} needs torchao, which is not installed: pip install torchao")
        return func(*args, **kwargs)

    return wrapper


__all__ += [
    "is_bnb_available",
    "is_8bit_bnb_available",
    "is_4bit_bnb_available",
    "is_torchao_available",
    "torchao_required",
]


def is_tensorboard_available() -> bool:
    """True when ``tensorboard`` or ``tensorboardX`` is installed."""
    return package_available("tensorboard") or package_available("tensorboardX")


def is_mlflow_available() -> bool:
    """True when ``mlflow`` (or only ``mlflow-skinny``) is installed."""
    return package_available("mlflow", "mlflow", "mlflow-skinny")


def is_aim_available() -> bool:
    """True when ``aim`` below 4.0 is installed (the tracker API the reference supports)."""
    return package_available("aim") and compare_versions("aim", "<", "4.0.0")


def is_rich_available() -> bool:
    """True when ``rich`` is installed and ``ACCELERATE_ENABLE_RICH`` is set to a true value."""
    from .environment import parse_flag_from_env

    return package_available("rich") and parse_flag_from_env("ACCELERATE_ENABLE_RICH", False)


def is_torchdata_stateful_dataloader_available() -> bool:
    """True when torchdata provides ``torchdata.stateful_dataloader.StatefulDataLoader`` (torchdata 0.8 and later)."""
    return package_available("torchdata") and compare_versions("torchdata", ">=", "0.8.0")


def is_torch_distributed_available() -> bool:
    """True when this torch build has ``torch.distributed``."""
    import torch

    return torch.distributed.is_available()


def is_weights_only_available() -> bool:
    """True when ``torch.load`` takes ``weights_only`` (torch 2.4 and later, as the reference counts)."""
    return is_torch_version(">=", "2.4.0")


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """True when numpy ``min_version`` or later is installed."""
    return package_available("numpy") and compare_versions("numpy", ">=", min_version)


def is_pippy_available() -> bool:
    """True when torch ships pipeline parallelism (``torch.distributed.pipelining``, torch 2.4 and later)."""
    return is_torch_version(">=", "2.4.0")


def is_cuda_available() -> bool:
    """``torch.cuda.is_available()`` without initialising CUDA in this process (NVML-based check, as forking needs)."""
    import torch

    previous = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if previous is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = previous


def is_rocm_available() -> bool:
    """True on a ROCm (HIP) build of torch with a usable GPU."""
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """True when Apple's MPS backend is built and available (and torch is at least ``min_version``)."""
    import torch

    return (
        is_torch_version(">=", min_version)
        and torch.backends.mps.is_available()
        and torch.backends.mps.is_built()
    )


def is_xpu_available(check_device: bool = False) -> bool:
    """True when torch has an Intel XPU backend with a device."""
    import torch

    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """True when ``torch_xla`` is installed (it is not imported to check; the device kind is not probed).

    ``check_is_tpu`` / ``check_is_gpu`` need torch_xla's runtime and import it.
    """
    if not package_available("torch_xla", "torch_xla", "torch-xla"):
        return False
    if check_is_tpu or check_is_gpu:
        import torch_xla.runtime as xr

        kind = xr.device_type()
        return kind == "TPU" if check_is_tpu else kind in ("GPU", "CUDA")
    return True


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bfloat16 works here: always on CPU, on CUDA when the GPU supports it, on TPU unless ``ignore_tpu``."""
    import torch

    if is_torch_xla_available(check_is_tpu=False) and os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        return not ignore_tpu
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    if is_mps_available():
        return torch.backends.mps.is_macos_or_newer(14, 0)
    return True


def is_fp16_available() -> bool:
    """True: float16 autocast is available on every device accel_nb runs on."""
    return True


def _never(name: str, why: str) -> Callable[..., bool]:
    def check(*args: Any, **kwargs: Any) -> bool:
        return False

    check.__name__ = check.__qualname__ = name
    check.__doc__ = f"False: {why} (the reference's arguments are accepted and ignored)."
    return check


# The reference's checks for what accel_nb has no back-end for: here the answer is always "not available",
# so code that branches on them takes its plain CUDA/CPU path.
_NO_DEVICE = "accel_nb does not run on this kind of device"
is_npu_available = _never("is_npu_available", _NO_DEVICE)
is_mlu_available = _never("is_mlu_available", _NO_DEVICE)
is_musa_available = _never("is_musa_available", _NO_DEVICE)
is_sdaa_available = _never("is_sdaa_available", _NO_DEVICE)
is_hpu_available = _never("is_hpu_available", _NO_DEVICE)
is_habana_gaudi1 = _never("is_habana_gaudi1", _NO_DEVICE)
is_neuron_available = _never("is_neuron_available", _NO_DEVICE)
is_xccl_available = _never("is_xccl_available", "accel_nb does not use XPU collectives (xccl)")


def is_megatron_lm_available() -> bool:
    """True when the launch asks for Megatron-LM (``ACCELERATE_USE_MEGATRON_LM=true``) and megatron-core is
    installed: the reference's answer, except that it looks for Megatron-LM's ``megatron.training`` (accel_nb runs
    on megatron-core; docs/megatron.md)."""
    if os.environ.get("ACCELERATE_USE_MEGATRON_LM", "").strip().lower() not in ("1", "true", "yes"):
        return False
    return (
        package_available("megatron", "megatron-core")
        and importlib.util.find_spec("megatron.core") is not None
    )


def is_transformer_engine_available() -> bool:
    """True when NVIDIA's TransformerEngine is installed (it needs CUDA; accel_nb refuses it without a GPU)."""
    return package_available("transformer_engine", "transformer-engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """True when TransformerEngine is installed and says this GPU runs MXFP8 block scaling."""
    if not is_transformer_engine_available():
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support  # deferred: imports CUDA libraries

    return bool(check_mxfp8_support()[0])


def is_fp8_available() -> bool:
    """True when a library that trains in FP8 is installed: torchao (accel_nb runs it on CPU and GPU),
    TransformerEngine or MS-AMP (both need an NVIDIA GPU), as the reference answers."""
    return is_torchao_available() or is_transformer_engine_available() or is_msamp_available()  # noqa: F821


__all__ += sorted(n for n in list(globals()) if n.startswith("is_") and n not in __all__)


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


def in_ipython_kernel() -> bool:
    """True in a Jupyter kernel (its shell or a subclass, e.g. Colab's), checked without importing IPython.

    in_ipython_kernel()   # False in a script or a plain terminal IPython
    """
    ipython_mod = sys.modules.get("IPython")
    if ipython_mod is None:  # IPython not even loaded: certainly no kernel
        return False
    try:
        shell = ipython_mod.get_ipython()
    except AttributeError:  # a half-imported or stand-in IPython module
        return False
    return shell is not None and any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__)
