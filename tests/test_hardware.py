"""Hardware detection: NVML through ctypes (no CUDA context), CUDA_VISIBLE_DEVICES, TPU hints, the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from accel_nb import hardware

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A stand-in for the NVIDIA driver's libnvidia-ml.so.1 with the same C entry points, so the ctypes
# code runs for real on a machine without GPUs. Devices come from FAKE_NVML_GPUS="name:GiB:cc,...".
FAKE_NVML_C = r"""
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
typedef struct { unsigned long long total, free, used; } mem_t;
static int n = 0; static char names[8][64]; static unsigned long long gib[8]; static int ma[8], mi[8];
static int inited = 0;
int nvmlInit_v2(void) {
  const char *spec = getenv("FAKE_NVML_GPUS"); n = 0; inited = 1;
  if (getenv("FAKE_NVML_INIT_FAILS")) return 9;
  if (!spec || !*spec) return 0;
  char buf[512]; strncpy(buf, spec, 511); buf[511] = 0;
  for (char *tok = strtok(buf, ","); tok && n < 8; tok = strtok(NULL, ",")) {
    char name[64]; double g; int a, b;
    if (sscanf(tok, "%63[^:]:%lf:%d.%d", name, &g, &a, &b) == 4) {
      strcpy(names[n], name); gib[n] = (unsigned long long)(g * 1073741824.0); ma[n] = a; mi[n] = b; n++;
    }
  }
  return 0;
}
int nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(int code) { return code == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *c) { if (!inited) return 1; *c = n; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if (i >= (unsigned)n) return 2; *h = (void *)(size_t)(i + 1); return 0; }
int nvmlDeviceGetName(void *h, char *out, unsigned int len) { snprintf(out, len, "%s", names[(size_t)h - 1]); return 0; }
int nvmlDeviceGetUUID(void *h, char *out, unsigned int len) { snprintf(out, len, "GPU-%08zu-fake", (size_t)h - 1); return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) { m->total = gib[(size_t)h - 1]; m->free = m->total; m->used = 0; return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *a, int *b) { *a = ma[(size_t)h - 1]; *b = mi[(size_t)h - 1]; return 0; }
"""


@pytest.fixture(scope="module")
def fake_nvml_dir(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libnvidia-ml")
    d = tmp_path_factory.mktemp("fake_nvml")
    (d / "fake_nvml.c").write_text(FAKE_NVML_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(d / "libnvidia-ml.so.1"), str(d / "fake_nvml.c")], check=True
    )
    return str(d)


def _probe(code: str, env: dict[str, str]) -> dict:
    """Run ``code`` in a fresh interpreter (the dynamic loader reads LD_LIBRARY_PATH at start)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "FAKE_NVML_GPUS")}
    full_env.update(env)
    full_env["PYTHONPATH"] = ROOT
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE_GPUS = """
    import json, sys
    from accel_nb import hardware
    gpus = hardware.gpu_info()
    print(json.dumps({
        "count": hardware.cuda_device_count(),
        "gpus": [[g.index, g.name, g.total_memory, list(g.compute_capability), g.bf16] for g in gpus],
        "bf16_0": hardware.bf16_supported(0),
        "bf16_1": hardware.bf16_supported(1),
        "torch_imported": "torch" in sys.modules,
    }))
"""


def test_fake_driver_gpus_described_through_nvml(fake_nvml_dir):
    res = _probe(
        PROBE_GPUS, {"LD_LIBRARY_PATH": fake_nvml_dir, "FAKE_NVML_GPUS": "NVIDIA A100:80:8.0,Tesla T4:16:7.5"}
    )
    assert res["count"] == 2
    assert res["gpus"][0] == [0, "NVIDIA A100", 80 * 2**30, [8, 0], True]
    assert res["gpus"][1] == [1, "Tesla T4", 16 * 2**30, [7, 5], False]
    assert res["bf16_0"] is True and res["bf16_1"] is False
    assert res["torch_imported"] is False  # counting GPUs does not even import torch


@pytest.mark.parametrize(
    "visible, expected",
    [
        ("1", ["Tesla T4"]),
        ("1,0", ["Tesla T4", "NVIDIA A100"]),
        ("", []),
        ("-1", []),
        ("0,7,1", ["NVIDIA A100"]),  # CUDA stops at the first id that matches nothing
        ("GPU-00000001", ["Tesla T4"]),  # a UUID prefix
        ("0,0", []),  # a device named twice: CUDA sees none
    ],
)
def test_cuda_visible_devices_is_honoured(fake_nvml_dir, visible, expected):
    res = _probe(
        PROBE_GPUS,
        {
            "LD_LIBRARY_PATH": fake_nvml_dir,
            "FAKE_NVML_GPUS": "NVIDIA A100:80:8.0,Tesla T4:16:7.5",
            "CUDA_VISIBLE_DEVICES": visible,
        },
    )
    assert [g[1] for g in res["gpus"]] == expected
    assert res["count"] == len(expected)
    assert [g[0] for g in res["gpus"]] == list(range(len(expected)))  # renumbered as CUDA does


def test_driver_that_fails_to_initialise_means_no_gpus(fake_nvml_dir):
    res = _probe(
        PROBE_GPUS,
        {"LD_LIBRARY_PATH": fake_nvml_dir, "FAKE_NVML_GPUS": "A:1:8.0", "FAKE_NVML_INIT_FAILS": "1"},
    )
    assert res["count"] == 0 and res["gpus"] == []


def test_report_lists_fake_gpus(fake_nvml_dir, tmp_path):
    code = """
        import json
        from accel_nb import hardware
        hw = hardware.detect()
        print(json.dumps({"report": hardware.hardware_report(hw), "nvml": hw.nvml_available,
                          "bf16": hw.bf16_gpus}))
    """
    res = _probe(
        code,
        {
            "LD_LIBRARY_PATH": fake_nvml_dir,
            "FAKE_NVML_GPUS": "NVIDIA H100:80:9.0",
            "ACCEL_NB_CONFIG_FILE": str(tmp_path / "none.yaml"),
        },
    )
    assert res["nvml"] is True and res["bf16"] is True
    assert "GPU 0: NVIDIA H100, 80.0 GiB, compute capability 9.0, bf16 yes" in res["report"]


def test_no_driver_here_counts_zero_and_creates_no_cuda_context():
    res = _probe(
        """
        import json, sys
        from accel_nb import hardware
        n = hardware.cuda_device_count(); info = hardware.gpu_info(); b = hardware.bf16_supported()
        hw = hardware.detect(); text = hardware.hardware_report(hw)
        imported_before = "torch" in sys.modules
        import torch
        print(json.dumps({"n": n, "info": len(info), "bf16": b, "cuda_init": torch.cuda.is_initialized(),
                          "torch_imported_before": imported_before}))
        """,
        {"LD_LIBRARY_PATH": "/nonexistent"},
    )
    if res["n"]:
        pytest.skip("this machine has an NVIDIA driver; see the gpu test")
    assert res == {"n": 0, "info": 0, "bf16": False, "cuda_init": False, "torch_imported_before": False}


def test_calls_leave_cuda_uninitialised_in_this_process():
    import torch

    hardware.cuda_device_count()
    hardware.gpu_info()
    hardware.bf16_supported(0)
    hardware.detect()
    assert torch.cuda.is_initialized() is False


@pytest.mark.gpu
def test_real_gpus_counted_without_cuda_context():
    res = _probe(
        """
        import json
        from accel_nb import hardware
        n = hardware.cuda_device_count(); gpus = hardware.gpu_info()
        import torch
        before = torch.cuda.is_initialized()
        print(json.dumps({"n": n, "torch_n": torch.cuda.device_count(), "before": before,
                          "cc": [list(g.compute_capability) for g in gpus],
                          "torch_cc": [list(torch.cuda.get_device_capability(i)) for i in range(n)]}))
        """,
        {},
    )
    assert res["before"] is False
    assert res["n"] == res["torch_n"] >= 1
    assert res["cc"] == res["torch_cc"]


def test_detect_describes_cpu_memory_and_versions():
    import psutil
    import torch

    import accel_nb

    hw = hardware.detect()
    assert hw.cpu_logical_cores == psutil.cpu_count(logical=True)
    assert hw.ram_total and hw.ram_available and 0 < hw.ram_available <= hw.ram_total
    assert hw.torch_version == torch.__version__
    assert hw.accel_nb_version == accel_nb.__version__
    assert hw.python_version.count(".") == 2
    assert hw.os


def _tpu_tree(root, google_devices=0, accel=0, vfio=0, other_vendor=False):
    """A /dev and /sys of a machine under ``root``: Google PCI devices, /dev/accelN, /dev/vfio/N."""
    dev, sysfs = root / "dev", root / "sys"
    (dev / "vfio").mkdir(parents=True)
    pci = sysfs / "bus" / "pci" / "devices"
    pci.mkdir(parents=True)
    for i in range(google_devices):
        (pci / f"0000:00:0{i + 4}.0").mkdir()
        (pci / f"0000:00:0{i + 4}.0" / "vendor").write_text("0x1ae0\n")
    if other_vendor:  # an NVIDIA GPU
        (pci / "0000:00:1e.0").mkdir()
        (pci / "0000:00:1e.0" / "vendor").write_text("0x10de\n")
    for i in range(accel):
        (dev / f"accel{i}").write_text("")
    for i in range(vfio):
        (dev / "vfio" / str(i)).write_text("")
    (dev / "vfio" / "vfio").write_text("")  # the control file is not a chip
    return str(dev), str(sysfs)


def test_tpu_chips_from_google_pci_devices_and_device_files(tmp_path):
    from accel_nb.xla_detect import detect_tpu

    dev, sysfs = _tpu_tree(tmp_path / "v5e", google_devices=8, vfio=8)
    tpu = detect_tpu({}, dev_root=dev, sys_root=sysfs)  # a v5e-8 (Kaggle), no variables at all
    assert tpu.detected and tpu.chips == 8 and tpu.devices == 8
    assert "8 Google PCI devices" in tpu.evidence[0] and any("vfio/0" in e for e in tpu.evidence)
    dev, sysfs = _tpu_tree(tmp_path / "v3", accel=4)
    tpu = detect_tpu({"TPU_ACCELERATOR_TYPE": "v3-8"}, dev_root=dev, sys_root=sysfs)
    assert tpu.detected and tpu.chips == 4 and tpu.devices == 8  # two cores per v3 chip
    assert "TPU_ACCELERATOR_TYPE=v3-8" in tpu.evidence


def test_nvidia_accel_files_or_host_names_are_not_a_tpu(tmp_path):
    from accel_nb.xla_detect import detect_tpu

    # NVIDIA's driver (570+) makes /dev/accel* too: without a Google device or TPU variables, a hint only
    dev, sysfs = _tpu_tree(tmp_path / "gpu", accel=2, other_vendor=True)
    env = {"COLAB_TPU_ADDR": "10.0.0.2:8470", "KAGGLE_KERNEL_RUN_TYPE": "Interactive", "COLAB_GPU": "0"}
    tpu = detect_tpu(env, dev_root=dev, sys_root=sysfs)
    assert not tpu.detected and tpu.chips == 0 and tpu.evidence == []
    assert any("without a Google device" in h for h in tpu.hints)
    assert "COLAB_TPU_ADDR is set" in tpu.hints
    tpu = detect_tpu({"PJRT_DEVICE": "TPU"}, dev_root=dev, sys_root=sysfs)
    assert tpu.detected and tpu.evidence == ["PJRT_DEVICE=TPU"]


def test_xla_runtime_needs_torch_xla_and_pjrt_or_chips(tmp_path):
    from accel_nb.xla_detect import TpuInfo, detect_tpu, xla_runtime

    none = TpuInfo()
    assert xla_runtime({"PJRT_DEVICE": "CPU"}, tpu=none, installed=False) is None
    assert xla_runtime({}, tpu=none, installed=True) is None
    cpu = xla_runtime({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}, tpu=none, installed=True)
    assert (cpu.device, cpu.num_devices) == ("CPU", 2)
    assert xla_runtime({"PJRT_DEVICE": "cpu"}, tpu=none, installed=True).num_devices == 1
    dev, sysfs = _tpu_tree(tmp_path, google_devices=1, vfio=1)  # Colab's v5e-1
    tpu = detect_tpu({}, dev_root=dev, sys_root=sysfs)
    runtime = xla_runtime({}, tpu=tpu, installed=True)
    assert (runtime.device, runtime.num_devices) == ("TPU", 1)
    assert "TPU runtime, 1 device" in runtime.describe()


def test_report_shows_tpu_runtime_and_no_gpus(tmp_path):
    from accel_nb.xla_detect import detect_tpu, xla_runtime

    dev, sysfs = _tpu_tree(tmp_path, google_devices=8, vfio=8)
    tpu = detect_tpu({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, dev_root=dev, sys_root=sysfs)
    hw = hardware.detect()
    hw.tpu_detected, hw.tpu_hints, hw.tpu_chips = tpu.detected, tpu.evidence + tpu.hints, tpu.chips
    hw.xla_available, hw.xla_runtime = True, xla_runtime({}, tpu=tpu, installed=True)
    text = hardware.hardware_report(hw)
    assert "TPU detected, 8 chips (8 Google PCI devices" in text
    assert "- XLA launch: TPU runtime, 8 devices" in text
    if not hw.nvml_available:
        assert "- GPUs: none (no NVIDIA driver found)" in text


def test_device_backends_read_from_entry_points(tmp_path):
    from accel_nb.xla_detect import backend_lines, device_backends

    info = tmp_path / "torch_tpu-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-tpu\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntpu = torch_tpu:_autoload\n")
    other = tmp_path / "plain-1.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: plain\nVersion: 1.0\n")
    found = device_backends([str(tmp_path)])
    assert [(b.distribution, b.name, b.value, b.is_torch_tpu) for b in found] == [
        ("torch-tpu", "tpu", "torch_tpu:_autoload", True)
    ]
    (line,) = backend_lines(found, {})
    assert line.startswith("TorchTPU torch-tpu") and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in line
    assert "auto-loaded" in line
    (line,) = backend_lines(found, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert "not loaded" in line
    assert device_backends([str(tmp_path / "empty")]) == []


def test_report_names_the_saved_config_and_survives_a_broken_one(monkeypatch, tmp_path):
    from accel_nb.env_report import environment_report

    cfg = tmp_path / "cfg.yaml"
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(cfg))
    text = environment_report()
    assert f"none saved ({cfg})" in text
    cfg.write_text("num_processes: 2\ndistributed_type: MULTI_CPU\n")
    text = environment_report()
    assert f"Launch config ({cfg}):" in text and "num_processes: 2" in text
    cfg.write_text("num_processes: [2\n")
    text = environment_report()
    assert "Launch config: could not be read" in text and "line" in text
    for line in (
        "accel_nb version",
        "Python version",
        "PyTorch version",
        "CPU cores",
        "RAM",
        "GPUs",
        "TPU/XLA",
    ):
        assert line in text
