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


def test_tpu_runtime_evidence_versus_name_hints(monkeypatch):
    for name in ("PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "TPU_NAME", "XRT_TPU_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    if hardware._tpu_evidence()[0]:
        pytest.skip("this machine has TPU device files")
    monkeypatch.setenv("COLAB_TPU_ADDR", "10.0.0.2:8470")
    hw = hardware.detect()
    assert hw.tpu_detected is False  # an environment name alone is only a hint
    assert any("COLAB_TPU_ADDR" in h for h in hw.tpu_hints)
    assert "no TPU runtime (hints: COLAB_TPU_ADDR is set)" in hardware.hardware_report(hw)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    hw = hardware.detect()
    assert hw.tpu_detected is True
    assert "TPU detected (PJRT_DEVICE=TPU" in hardware.hardware_report(hw)


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
