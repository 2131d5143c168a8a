"""Is this an XLA runtime (TPU chips, or torch_xla's CPU backend), and is TorchTPU auto-loaded? Read without importing either.

Evidence comes from the runtime itself: Google PCI devices in sysfs (vendor ``0x1ae0``), TPU
device files (``/dev/accel*`` on v2-v4, ``/dev/vfio/N`` on v5e and later), ``PJRT_DEVICE``, and
the variables a TPU VM sets (``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_ID``, ...). Names of
notebook hosts (Colab, Kaggle) are never evidence. ``/dev/accel*`` alone is not either: NVIDIA's
driver creates such files too, so they count only next to a Google device or TPU variables.
Every function takes its roots and environment as arguments, so tests point them at a temporary
directory.

    from accel_nb.xla_detect import detect_tpu, xla_runtime
    tpu = detect_tpu()                  # TpuInfo(detected=False, chips=0, ...) on this machine
    xla_runtime()                       # None, or XlaRuntime(device='CPU', num_devices=2, ...)
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

GOOGLE_PCI_VENDOR = "0x1ae0"
AUTOLOAD_SWITCH = "TORCH_DEVICE_BACKEND_AUTOLOAD"
# variables a TPU VM (Kaggle's TPU runtime, Colab's, Cloud TPU) sets for libtpu
TPU_VM_VARIABLES = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_ID",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_SKIP_MDS_QUERY",
)
# older or remote-TPU spellings: hints only (a TPU node elsewhere, not chips on this machine)
TPU_HINT_VARIABLES = ("COLAB_TPU_ADDR", "TPU_NAME", "XRT_TPU_CONFIG")


@dataclass(frozen=True)
class TpuInfo:
    """TPU chips on this machine: ``detected``, how many, what said so (``evidence``), and mere ``hints``."""

    detected: bool = False
    chips: int = 0
    accelerator_type: str | None = None  # e.g. "v5litepod-8", from TPU_ACCELERATOR_TYPE
    evidence: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def devices(self) -> int:
        """XLA devices torch_xla makes of the chips: two per chip on v2/v3, one from v4 on."""
        generation = re.match(r"v(\d+)", self.accelerator_type or "")
        per_chip = 2 if generation and int(generation.group(1)) <= 3 else 1
        return self.chips * per_chip


def _google_pci_devices(sys_root: str) -> list[str]:
    found = []
    for vendor_file in sorted(glob.glob(os.path.join(sys_root, "bus", "pci", "devices", "*", "vendor"))):
        try:
            with open(vendor_file) as f:
                if f.read().strip().lower() == GOOGLE_PCI_VENDOR:
                    found.append(os.path.basename(os.path.dirname(vendor_file)))
        except OSError:
            continue
    return found


def _short(paths: list[str]) -> str:
    return ", ".join(paths[:4]) + (" ..." if len(paths) > 4 else "")


def detect_tpu(
    env: Mapping[str, str] | None = None, dev_root: str = "/dev", sys_root: str = "/sys"
) -> TpuInfo:
    """TPU chips on this machine, from sysfs, device files and TPU VM variables (never from a host's name).

    detect_tpu().detected                        # False on a machine without TPU
    detect_tpu({"PJRT_DEVICE": "TPU"}, dev_root=tmp, sys_root=tmp)
    """
    env = os.environ if env is None else env
    evidence: list[str] = []
    hints: list[str] = []
    google = _google_pci_devices(sys_root)
    tpu_vars = [name for name in TPU_VM_VARIABLES if env.get(name)]
    accel = sorted(glob.glob(os.path.join(dev_root, "accel[0-9]*")))
    vfio = sorted(p for p in glob.glob(os.path.join(dev_root, "vfio", "*")) if os.path.basename(p).isdigit())
    if google:
        evidence.append(
            f"{len(google)} Google PCI device{'s' if len(google) != 1 else ''} ({_short(google)})"
        )
    trusted_files = bool(google or tpu_vars)
    chip_files = accel or vfio
    if chip_files and trusted_files:
        evidence.append(f"TPU device files {_short(chip_files)}")
    elif accel:
        hints.append(
            f"device files {_short(accel)} without a Google device or TPU variables (NVIDIA's driver makes them too)"
        )
    if env.get("PJRT_DEVICE", "").upper() == "TPU":
        evidence.append("PJRT_DEVICE=TPU")
    evidence += [f"{name}={env[name]}" for name in tpu_vars]
    hints += [f"{name} is set" for name in TPU_HINT_VARIABLES if env.get(name)]
    chips = len(google) or (len(chip_files) if trusted_files else 0)
    accelerator_type = env.get("TPU_ACCELERATOR_TYPE") or None
    if not chips and accelerator_type:  # "v5litepod-8": chips; "v3-8": cores (two per chip)
        m = re.match(r"v(\d+)\w*-(\d+)$", accelerator_type)
        if m:
            cores_named = int(m.group(1)) <= 4 or accelerator_type.startswith("v5p")
            chips = int(m.group(2)) // (2 if cores_named else 1) or 1
    return TpuInfo(bool(evidence), chips if evidence else 0, accelerator_type, evidence, hints)


def torch_xla_installed() -> bool:
    """Whether ``torch_xla`` can be imported here (found, not imported: importing it is slow)."""
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class XlaRuntime:
    """What an XLA launch would run on: the PJRT ``device`` kind and how many devices (world size)."""

    device: str  # "TPU" or "CPU" (PJRT_DEVICE)
    num_devices: int
    why: str

    def describe(self) -> str:
        kind = "TPU" if self.device == "TPU" else f"XLA {self.device}"
        return f"{kind} runtime, {self.num_devices} device{'s' if self.num_devices != 1 else ''} ({self.why})"


def xla_runtime(
    env: Mapping[str, str] | None = None,
    tpu: TpuInfo | None = None,
    installed: bool | None = None,
) -> XlaRuntime | None:
    """The XLA runtime a launch would use here, or None: torch_xla installed and ``PJRT_DEVICE`` set or TPU chips present.

    xla_runtime({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}, installed=True)
    # XlaRuntime(device='CPU', num_devices=2, why='PJRT_DEVICE=CPU, CPU_NUM_DEVICES=2')
    """
    env = os.environ if env is None else env
    installed = torch_xla_installed() if installed is None else installed
    if not installed:
        return None
    tpu = detect_tpu(env) if tpu is None else tpu
    device = env.get("PJRT_DEVICE", "").strip().upper()
    if not device:
        if not tpu.detected:
            return None
        device = "TPU"  # torch_xla picks the TPU by itself when chips are present
    if device == "TPU":
        n = tpu.devices or 1
        return XlaRuntime("TPU", n, "; ".join(tpu.evidence) or "PJRT_DEVICE=TPU")
    if device == "CPU":
        raw = env.get("CPU_NUM_DEVICES", "").strip()
        n = int(raw) if raw.isdigit() and int(raw) > 0 else 1
        return XlaRuntime("CPU", n, "PJRT_DEVICE=CPU" + (f", CPU_NUM_DEVICES={raw}" if raw else ""))
    return XlaRuntime(device, 1, f"PJRT_DEVICE={device}")


@dataclass(frozen=True)
class DeviceBackend:
    """A package that ``import torch`` loads by itself (entry point group ``torch.backends``)."""

    name: str  # the entry point's name
    value: str  # what it loads, "module:function"
    distribution: str  # the installing package, e.g. "torch-tpu"

    @property
    def is_torch_tpu(self) -> bool:
        return self.distribution.lower().replace("_", "-") == "torch-tpu" or self.value.startswith(
            "torch_tpu"
        )


def device_backends(paths: list[str] | None = None) -> list[DeviceBackend]:
    """Every device backend torch auto-loads on import (installed entry points of group ``torch.backends``).

    [b.distribution for b in device_backends()]          # ['torch-tpu'] where TorchTPU is installed
    """
    from importlib.metadata import distributions

    found: list[DeviceBackend] = []
    for dist in distributions(**({"path": paths} if paths is not None else {})):
        try:
            points = [ep for ep in dist.entry_points if ep.group == "torch.backends"]
        except Exception:  # noqa: BLE001 - a broken dist-info must not break a report
            continue
        name = (dist.metadata["Name"] if dist.metadata else None) or "?"
        found += [DeviceBackend(ep.name, ep.value, name) for ep in points]
    return found


def autoload_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``import torch`` loads device backends (``TORCH_DEVICE_BACKEND_AUTOLOAD`` unset or not 0)."""
    env = os.environ if env is None else env
    return env.get(AUTOLOAD_SWITCH, "1").strip() not in ("0", "false", "False")


def backend_lines(backends: list[DeviceBackend], env: Mapping[str, str] | None = None) -> list[str]:
    """Report lines for auto-loaded device backends (TorchTPU named, with the switch that disables it)."""
    lines = []
    on = autoload_enabled(env)
    for b in backends:
        what = "TorchTPU" if b.is_torch_tpu else "device backend"
        state = (
            f"auto-loaded by `import torch` (disable: {AUTOLOAD_SWITCH}=0)"
            if on
            else f"installed, not loaded ({AUTOLOAD_SWITCH}=0)"
        )
        lines.append(f"{what} {b.distribution} ({b.name} = {b.value}): {state}")
    return lines
