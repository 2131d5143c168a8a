"""Make this process (or a test kernel) report "CUDA was initialised" on a machine without a GPU.

The launcher's fork-safety check asks ``accel_nb.launch.cuda_guard.cuda_initialized()``; these
helpers replace that probe for one test, so production code carries no switch for tests.

    pretend_cuda_initialised(monkeypatch)              # in this process, undone after the test
    kernel.run(KERNEL_PRETEND); ...; kernel.run(KERNEL_STOP_PRETENDING)
"""

from __future__ import annotations

from typing import Any

# code for a kernel cell: swap the probe, remembering the real one
KERNEL_PRETEND = (
    "import accel_nb.launch.cuda_guard as _cuda_guard\n"
    "_real_cuda_initialized = _cuda_guard.cuda_initialized\n"
    "_cuda_guard.cuda_initialized = lambda: True\n"
)
KERNEL_STOP_PRETENDING = "_cuda_guard.cuda_initialized = _real_cuda_initialized\n"


def pretend_cuda_initialised(monkeypatch: Any) -> None:
    """From now until the test ends, this process reports CUDA as initialised (so fork is unsafe)."""
    from accel_nb.launch import cuda_guard

    monkeypatch.setattr(cuda_guard, "cuda_initialized", lambda: True)


def _fake_nvml_devices(count: int) -> list[dict[str, Any]]:
    return [
        {
            "nvml_index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": f"GPU-00000000-0000-0000-0000-00000000000{i}",
            "total_memory": 80 << 30,
            "compute_capability": (9, 0),
        }
        for i in range(count)
    ]


def pretend_gpus(monkeypatch: Any, count: int) -> None:
    """From now until the test ends, NVML reports ``count`` H100s here (``CUDA_VISIBLE_DEVICES`` still applies).

    Every GPU count of accel_nb (``hardware.gpu_info``, ``cuda_device_count``, ``detect``) reads NVML's list.
    """
    from accel_nb import hardware

    monkeypatch.setattr(hardware, "_nvml_devices", lambda: _fake_nvml_devices(count))


def kernel_pretend_gpus(count: int) -> str:
    """Code for a kernel cell: NVML reports ``count`` H100s in that kernel from now on."""
    return (
        "import accel_nb.hardware as _hardware\n"
        f"_hardware._nvml_devices = lambda: {_fake_nvml_devices(count)!r}\n"
    )
