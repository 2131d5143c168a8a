"""What this machine has: CPU cores, memory, GPUs (through NVML), TPU/XLA, MPS, software versions.

Nothing here creates a CUDA context: GPUs are counted and described through NVML (the driver's
management library, loaded with ctypes), never through ``torch.cuda``. So a launcher may call
these functions and still fork its workers safely afterwards.

    from accel_nb import hardware
    hardware.cuda_device_count()     # 0 on a machine without NVIDIA driver
    print(hardware.hardware_report())

This module knows nothing of the launch config; ``accel_nb.env_report`` puts the two together.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from . import xla_detect
from .availability import imported_module
from .byte_sizes import human_bytes

_NVML_LIBRARIES = ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll")
_NVML_SUCCESS = 0


@dataclass(frozen=True)
class GPUInfo:
    """One CUDA device as CUDA numbers it in this process (after ``CUDA_VISIBLE_DEVICES``)."""

    index: int
    name: str
    total_memory: int  # bytes
    compute_capability: tuple[int, int]
    bf16: bool
    uuid: str = ""

    def describe(self) -> str:
        major, minor = self.compute_capability
        return (
            f"GPU {self.index}: {self.name}, {human_bytes(self.total_memory)}, compute capability "
            f"{major}.{minor}, bf16 {'yes' if self.bf16 else 'no'}"
        )


@dataclass
class HardwareInfo:
    """A snapshot of the machine, for defaults and for bug reports."""

    cpu_physical_cores: int | None
    cpu_logical_cores: int
    ram_total: int | None
    ram_available: int | None
    gpus: list[GPUInfo] = field(default_factory=list)
    nvml_available: bool = False
    cuda_visible_devices: str | None = None
    xla_available: bool = False  # torch_xla can be imported
    tpu_detected: bool = False  # evidence of TPU chips (Google PCI devices, device files, TPU VM variables)
    tpu_hints: list[str] = field(default_factory=list)  # the evidence, then mere hints
    tpu_chips: int = 0
    xla_runtime: Any = None  # xla_detect.XlaRuntime: what an XLA launch would run on (None: no XLA runtime)
    device_backends: list[Any] = field(default_factory=list)  # xla_detect.DeviceBackend: auto-loaded by torch
    backend_autoload: bool = True  # TORCH_DEVICE_BACKEND_AUTOLOAD is not 0
    mps_available: bool = False
    python_version: str = ""
    torch_version: str | None = None
    torch_cuda_version: str | None = None
    accel_nb_version: str = ""
    os: str = ""
    notebook_host: str | None = None  # "colab", "kaggle" or None (a hint only)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def bf16_gpus(self) -> bool:
        """True when every visible GPU supports bf16 (there must be at least one)."""
        return bool(self.gpus) and all(g.bf16 for g in self.gpus)


# --------------------------------------------------------------------------------------------
# NVML through ctypes
# --------------------------------------------------------------------------------------------


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlUnavailable(RuntimeError):
    """The NVIDIA management library is missing or failed to initialise (no driver, no GPU)."""


def _load_nvml() -> Any:
    last: Exception | None = None
    for name in _NVML_LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            last = exc
    raise NvmlUnavailable(f"libnvidia-ml could not be loaded ({last}); no NVIDIA driver on this machine")


def _check(lib: Any, code: int, what: str) -> None:
    if code != _NVML_SUCCESS:
        try:
            lib.nvmlErrorString.restype = ctypes.c_char_p
            text = lib.nvmlErrorString(code).decode(errors="replace")
        except AttributeError:  # pragma: no cover - very old drivers lack nvmlErrorString
            text = f"error {code}"
        raise NvmlUnavailable(f"{what} failed: {text}")


def _nvml_devices() -> list[dict[str, Any]]:
    """Every physical GPU NVML knows, in NVML order: index, name, uuid, memory, compute capability."""
    lib = _load_nvml()
    init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
    _check(lib, init(), "nvmlInit")
    try:
        count = ctypes.c_uint(0)
        get_count = getattr(lib, "nvmlDeviceGetCount_v2", None) or lib.nvmlDeviceGetCount
        _check(lib, get_count(ctypes.byref(count)), "nvmlDeviceGetCount")
        get_handle = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or lib.nvmlDeviceGetHandleByIndex
        devices = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            _check(
                lib, get_handle(ctypes.c_uint(i), ctypes.byref(handle)), f"nvmlDeviceGetHandleByIndex({i})"
            )
            name = ctypes.create_string_buffer(256)
            _check(lib, lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(256)), "nvmlDeviceGetName")
            uuid = ctypes.create_string_buffer(96)
            if lib.nvmlDeviceGetUUID(handle, uuid, ctypes.c_uint(96)) != _NVML_SUCCESS:
                uuid.value = b""
            mem = _NvmlMemory()
            total = (
                mem.total if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == _NVML_SUCCESS else 0
            )
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            cc_fn = lib.nvmlDeviceGetCudaComputeCapability
            if cc_fn(handle, ctypes.byref(major), ctypes.byref(minor)) != _NVML_SUCCESS:
                major.value, minor.value = 0, 0
            devices.append(
                {
                    "nvml_index": i,
                    "name": name.value.decode(errors="replace"),
                    "uuid": uuid.value.decode(errors="replace"),
                    "total_memory": int(total),
                    "compute_capability": (major.value, minor.value),
                }
            )
        return devices
    finally:
        lib.nvmlShutdown()


def _visible(devices: list[dict[str, Any]], spec: str | None) -> list[dict[str, Any]]:
    """Apply ``CUDA_VISIBLE_DEVICES`` the way the CUDA runtime does.

    Entries are indices or (prefixes of) UUIDs; the list stops at the first entry that matches
    nothing (so ``-1`` hides every GPU), and a device named twice makes CUDA see none.
    """
    if spec is None:
        return list(devices)
    chosen: list[dict[str, Any]] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            break
        match = None
        if entry.lstrip("+").isdigit():
            idx = int(entry)
            match = devices[idx] if 0 <= idx < len(devices) else None
        elif entry.startswith(("GPU-", "MIG-")):
            hits = [d for d in devices if d["uuid"] and d["uuid"].startswith(entry)]
            if not hits and entry.startswith("MIG-"):
                # MIG instances are not NVML top-level devices; count them on their parent.
                match = {
                    "nvml_index": -1,
                    "name": "MIG instance",
                    "uuid": entry,
                    "total_memory": 0,
                    "compute_capability": devices[0]["compute_capability"] if devices else (0, 0),
                }
            elif len(hits) == 1:
                match = hits[0]
        if match is None:
            break
        if any(c is match for c in chosen):
            return []
        chosen.append(match)
    return chosen


def gpu_info() -> list[GPUInfo]:
    """The CUDA devices this process may use, described through NVML (no CUDA context is made).

    for gpu in gpu_info():
        print(gpu.describe())
    """
    try:
        devices = _nvml_devices()
    except (NvmlUnavailable, AttributeError, OSError):
        return []
    return _describe_visible(devices)


def _describe_visible(devices: list[dict[str, Any]]) -> list[GPUInfo]:
    visible = _visible(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [
        GPUInfo(
            index=i,
            name=d["name"],
            total_memory=d["total_memory"],
            compute_capability=tuple(d["compute_capability"]),
            bf16=d["compute_capability"] >= (8, 0),
            uuid=d["uuid"],
        )
        for i, d in enumerate(visible)
    ]


def cuda_device_count() -> int:
    """How many CUDA devices this process can see (NVML + ``CUDA_VISIBLE_DEVICES``); 0 without a driver.

    Safe to call before forking: it neither imports ``torch.cuda`` state nor calls ``cuInit``.
    """
    return len(gpu_info())


def bf16_supported(index: int = 0) -> bool:
    """Whether visible CUDA device ``index`` computes in bf16 natively (compute capability >= 8.0)."""
    gpus = gpu_info()
    return 0 <= index < len(gpus) and gpus[index].bf16


# --------------------------------------------------------------------------------------------
# The rest of the machine
# --------------------------------------------------------------------------------------------


def _notebook_host() -> str | None:
    if (
        os.environ.get("COLAB_RELEASE_TAG")
        or os.environ.get("COLAB_GPU") is not None
        or "google.colab" in sys.modules
    ):
        return "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.environ.get("KAGGLE_URL_BASE"):
        return "kaggle"
    return None


def _mps_available() -> bool:
    if sys.platform != "darwin":
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.backends.mps.is_available())


def _torch_versions() -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built for, read without importing torch (it is slow)."""
    torch = imported_module("torch")
    if torch is not None and hasattr(torch, "version"):
        return str(torch.__version__), getattr(torch.version, "cuda", None)
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    version = cuda = None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            for line in f:
                m = re.match(r"^(__version__|cuda)\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", line)
                if m:
                    if m.group(1) == "__version__":
                        version = m.group(2)
                    else:
                        cuda = m.group(2)
    except OSError:
        pass
    return version, cuda


def tpu_report_lines(hw: HardwareInfo) -> list[str]:
    """The TPU/XLA lines of the report: chips and their evidence, the XLA runtime, auto-loaded backends."""
    xla = "torch_xla installed" if hw.xla_available else "torch_xla not installed"
    if hw.tpu_detected:
        chips = (
            f"{hw.tpu_chips} chip{'s' if hw.tpu_chips != 1 else ''}" if hw.tpu_chips else "chips not counted"
        )
        tpu = f"TPU detected, {chips} ({'; '.join(hw.tpu_hints)})"
    else:
        tpu = f"no TPU runtime (hints: {'; '.join(hw.tpu_hints)})" if hw.tpu_hints else "no TPU"
    lines = [f"- TPU/XLA: {tpu}, {xla}"]
    if hw.xla_runtime is not None:
        lines.append(f"- XLA launch: {hw.xla_runtime.describe()}")
    elif hw.tpu_detected and not hw.xla_available:
        lines.append("- XLA launch: not possible: torch_xla is not installed (pip install 'accel_nb[xla]')")
    lines += [
        f"- {line}"
        for line in xla_detect.backend_lines(
            hw.device_backends, {xla_detect.AUTOLOAD_SWITCH: "1" if hw.backend_autoload else "0"}
        )
    ]
    return lines


def detect() -> HardwareInfo:
    """Describe this machine without touching any accelerator.

    hw = detect()
    hw.num_gpus, hw.bf16_gpus, hw.cpu_logical_cores
    """
    import psutil

    from . import __version__

    try:
        vm = psutil.virtual_memory()
        ram_total, ram_available = int(vm.total), int(vm.available)
    except (OSError, RuntimeError):  # pragma: no cover - containers without a readable /proc/meminfo
        ram_total = ram_available = None
    try:
        gpus, nvml_ok = _describe_visible(_nvml_devices()), True
    except (NvmlUnavailable, AttributeError, OSError):
        gpus, nvml_ok = [], False
    tpu = xla_detect.detect_tpu()
    xla_installed = xla_detect.torch_xla_installed()
    torch_version, torch_cuda = _torch_versions()
    return HardwareInfo(
        cpu_physical_cores=psutil.cpu_count(logical=False),
        cpu_logical_cores=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        ram_total=ram_total,
        ram_available=ram_available,
        gpus=gpus,
        nvml_available=nvml_ok,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        xla_available=xla_installed,
        tpu_detected=tpu.detected,
        tpu_hints=tpu.evidence + tpu.hints,
        tpu_chips=tpu.chips,
        xla_runtime=xla_detect.xla_runtime(tpu=tpu, installed=xla_installed),
        device_backends=xla_detect.device_backends(),
        backend_autoload=xla_detect.autoload_enabled(),
        mps_available=_mps_available(),
        python_version=platform.python_version(),
        torch_version=torch_version,
        torch_cuda_version=torch_cuda,
        accel_nb_version=__version__,
        os=f"{platform.system()} {platform.release()} ({platform.machine()})",
        notebook_host=_notebook_host(),
    )


def hardware_report(hw: HardwareInfo | None = None) -> str:
    """Versions and hardware, one line each (``accel_nb.env_report`` adds the launch config).

    print(hardware_report())
    """
    hw = hw or detect()
    cores = f"{hw.cpu_logical_cores} logical"
    if hw.cpu_physical_cores:
        cores = f"{hw.cpu_physical_cores} physical / {cores}"
    lines = [
        "accel_nb environment",
        f"- accel_nb version: {hw.accel_nb_version}",
        f"- Python version: {hw.python_version} ({sys.executable})",
        f"- PyTorch version: {hw.torch_version or 'not installed'}"
        + (
            f" (built for CUDA {hw.torch_cuda_version})"
            if hw.torch_cuda_version
            else " (CPU build)"
            if hw.torch_version
            else ""
        ),
        f"- OS: {hw.os}",
        f"- CPU cores: {cores}",
        f"- RAM: {human_bytes(hw.ram_total) if hw.ram_total else 'unknown'} total, "
        f"{human_bytes(hw.ram_available) if hw.ram_available else 'unknown'} available",
    ]
    if hw.gpus:
        lines.append(
            f"- GPUs: {hw.num_gpus}"
            + (
                f" (CUDA_VISIBLE_DEVICES={hw.cuda_visible_devices})"
                if hw.cuda_visible_devices is not None
                else ""
            )
        )
        lines.extend(f"  - {g.describe()}" for g in hw.gpus)
    elif hw.nvml_available:
        lines.append(f"- GPUs: none visible (NVML works; CUDA_VISIBLE_DEVICES={hw.cuda_visible_devices!r})")
    else:
        lines.append("- GPUs: none (no NVIDIA driver found)")
    lines += tpu_report_lines(hw)
    lines.append(f"- MPS (Apple GPU): {'available' if hw.mps_available else 'no'}")
    if hw.notebook_host:
        lines.append(f"- Notebook host: {hw.notebook_host}")
    return "\n".join(lines)
