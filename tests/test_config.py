"""The launch config: YAML round trip, reference files, every validation error, bad files, atomic saves."""

from __future__ import annotations

import os
import warnings

import pytest

from accel_nb.config import (
    ConfigError,
    ConfigFileError,
    ConfigWarning,
    LaunchConfig,
    default_config,
    default_config_path,
    find_config_file,
    load_config,
    save_config,
)
from accel_nb.hardware import GPUInfo, HardwareInfo

# A config as the reference library's `accelerate config` writes it on a 4-GPU machine.
REFERENCE_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
  dynamo_use_dynamic: false
  dynamo_use_fullgraph: true
"""


@pytest.fixture
def cfg_path(tmp_path, monkeypatch):
    path = tmp_path / "conf" / "default_config.yaml"
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(path))
    return path


def _hw(gpus: list[GPUInfo] | None = None, **kw) -> HardwareInfo:
    return HardwareInfo(
        cpu_physical_cores=4,
        cpu_logical_cores=8,
        ram_total=2**34,
        ram_available=2**33,
        gpus=gpus or [],
        nvml_available=bool(gpus),
        **kw,
    )


def _gpu(i: int, cc: tuple[int, int] = (8, 0), name: str = "NVIDIA A100") -> GPUInfo:
    return GPUInfo(index=i, name=name, total_memory=80 * 2**30, compute_capability=cc, bf16=cc >= (8, 0))


# ------------------------------------------------------------------ files and round trip


def test_yaml_round_trip(cfg_path):
    cfg = LaunchConfig(
        distributed_type="MULTI_GPU",
        num_processes=4,
        num_machines=2,
        machine_rank=1,
        main_process_ip="10.1.2.3",
        main_process_port=29555,
        mixed_precision="bf16",
        gpu_ids="0,1",
        gradient_accumulation_steps=8,
        start_method="spawn",
        rdzv_backend="c10d",
        same_network=False,
        max_restarts=2,
        dynamo_backend="inductor",
        dynamo_mode="reduce-overhead",
        dynamo_use_fullgraph=True,
    )
    written = save_config(cfg)
    assert written == str(cfg_path) and cfg_path.exists()
    back = load_config()
    assert back == cfg
    assert back.source == str(cfg_path)
    assert save_config(back) == written and load_config() == cfg  # and again: stable


def test_reference_style_file_is_read(tmp_path):
    path = tmp_path / "default_config.yaml"
    path.write_text(REFERENCE_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reference keys must not warn
        cfg = load_config(str(path))
    assert cfg.distributed_type == "MULTI_GPU" and cfg.num_processes == 4
    assert cfg.mixed_precision == "bf16" and cfg.gpu_ids == "all" and cfg.machine_rank == 0
    assert cfg.dynamo_backend == "inductor" and cfg.dynamo_mode == "max-autotune" and cfg.dynamo_use_fullgraph
    assert cfg.extras["main_training_function"] == "main" and cfg.extras["downcast_bf16"] == "no"
    # saving keeps the reference keys the user had
    out = tmp_path / "again.yaml"
    save_config(cfg, str(out))
    text = out.read_text()
    for key in (
        "main_training_function: main",
        "downcast_bf16: 'no'",
        "tpu_use_sudo: false",
        "dynamo_backend: INDUCTOR",
    ):
        assert key in text
    assert load_config(str(out)) == cfg


def test_reference_cpu_default_and_unset_processes(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: null\n"
        "num_processes: -1\nuse_cpu: true\ngpu_ids: null\ndebug: false\n"
    )
    cfg = load_config(str(path))
    assert cfg.num_processes is None and cfg.mixed_precision == "no" and cfg.gpu_ids == "all" and cfg.use_cpu
    assert cfg.processes_here(_hw()) == 1


def test_old_tpu_spelling_and_numbers_as_strings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: TPU\nnum_processes: '8'\nmixed_precision: BF16\ngpu_ids: 0\n")
    cfg = load_config(str(path))
    assert (cfg.distributed_type, cfg.num_processes, cfg.mixed_precision, cfg.gpu_ids) == (
        "XLA",
        8,
        "bf16",
        "0",
    )


def test_no_file_means_none(cfg_path):
    assert load_config() is None
    assert find_config_file() is None


def test_explicit_location_never_falls_back_to_the_reference_file(cfg_path, tmp_path, monkeypatch):
    hf = tmp_path / "hf"
    (hf / "accelerate").mkdir(parents=True)
    (hf / "accelerate" / "default_config.yaml").write_text(REFERENCE_YAML)
    monkeypatch.setenv("HF_HOME", str(hf))
    assert load_config() is None  # ACCEL_NB_CONFIG_FILE is set: only that file counts
    monkeypatch.delenv("ACCEL_NB_CONFIG_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    cfg = load_config()  # no accel_nb file: the reference library's is used
    assert cfg is not None and cfg.num_processes == 4
    assert cfg.source == str(hf / "accelerate" / "default_config.yaml")


def test_default_path_honours_xdg_and_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ACCEL_NB_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_config_path() == str(tmp_path / "accel_nb" / "default_config.yaml")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_config_path() == str(tmp_path / "home" / ".config" / "accel_nb" / "default_config.yaml")
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", "~/elsewhere.yaml")
    assert default_config_path() == str(tmp_path / "home" / "elsewhere.yaml")


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("num_processes: 2\nmixed_precision: [bf16\nuse_cpu: true\n")
    with pytest.raises(ConfigFileError) as err:
        load_config(str(path))
    msg = str(err.value)
    assert str(path) in msg and "not valid YAML" in msg and "line 3" in msg


@pytest.mark.parametrize(
    "text, fragment",
    [("", "is empty"), ("- 1\n- 2\n", "must be a mapping"), ("just words\n", "must be a mapping")],
)
def test_file_that_is_not_a_mapping(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=fragment) as err:
        load_config(str(path))
    assert str(path) in str(err.value)


def test_unknown_keys_warn_and_loading_continues(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("num_process: 4\ncolour: blue\ndistributed_type: MULTI_CPU\nnum_processes: 2\n")
    with pytest.warns(ConfigWarning) as record:
        cfg = load_config(str(path))
    messages = [str(w.message) for w in record]
    assert any(
        "'num_process'" in m and "did you mean 'num_processes'" in m and str(path) in m for m in messages
    )
    assert any("'colour'" in m for m in messages)
    assert cfg.num_processes == 2 and cfg.distributed_type == "MULTI_CPU"
    assert "colour" not in cfg.to_dict()


def test_invalid_config_never_overwrites_the_old_one(cfg_path):
    save_config(LaunchConfig(distributed_type="MULTI_CPU", num_processes=2))
    before = cfg_path.read_text()
    with pytest.raises(ConfigError, match="num_processes"):
        save_config(LaunchConfig(distributed_type="MULTI_CPU", num_processes=0))
    assert cfg_path.read_text() == before
    assert os.listdir(cfg_path.parent) == [cfg_path.name]  # no temp file left behind
    assert load_config().num_processes == 2


def test_invalid_value_in_file_names_key_value_allowed_and_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: fp17\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    e = err.value
    assert e.key == "mixed_precision" and e.value == "fp17" and e.path == str(path)
    msg = str(e)
    assert "mixed_precision='fp17'" in msg and "no, fp16, bf16" in msg and str(path) in msg


# ------------------------------------------------------------------ every validation path

BAD_VALUES = [
    # (changes, key, fragment of the allowed text)
    ({"compute_environment": "AMAZON_SAGEMAKER"}, "compute_environment", "LOCAL_MACHINE"),
    ({"distributed_type": "MULTI_NPU"}, "distributed_type", "does not run Ascend NPUs"),
    (
        {"distributed_type": "MEGATRON_LM", "extras": {"megatron_lm_config": {"megatron_lm_bogus": 1}}},
        "megatron_lm_config",
        "megatron_lm_* keys",
    ),
    (
        {"distributed_type": "DEEPSPEED", "extras": {"deepspeed_config": {"zero_stage": 5}}},
        "deepspeed_config",
        "docs/deepspeed.md",
    ),
    (
        {"distributed_type": "FSDP", "num_processes": 2, "extras": {"fsdp_config": {"fsdp_bogus": 1}}},
        "fsdp_config",
        "fsdp_* keys",
    ),
    ({"distributed_type": "MULTI_TPU"}, "distributed_type", "NO, MULTI_CPU, MULTI_GPU, XLA"),
    ({"distributed_type": 3}, "distributed_type", "NO, MULTI_CPU"),
    ({"num_processes": 0}, "num_processes", "whole number >= 1"),
    ({"num_processes": "two"}, "num_processes", "whole number"),
    ({"num_processes": 2.5}, "num_processes", "whole number"),
    ({"num_processes": True}, "num_processes", "whole number"),
    ({"num_machines": 0}, "num_machines", ">= 1"),
    ({"machine_rank": -1}, "machine_rank", ">= 0"),
    (
        {"num_machines": 2, "machine_rank": 2, "main_process_ip": "10.0.0.1", "num_processes": 2},
        "machine_rank",
        "0 to 1",
    ),
    ({"mixed_precision": "fp4"}, "mixed_precision", "no, fp16, bf16, fp8"),
    ({"mixed_precision": "float16"}, "mixed_precision", "no, fp16, bf16"),
    ({"mixed_precision": 16}, "mixed_precision", "no, fp16, bf16"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", ">= 1"),
    ({"gradient_accumulation_steps": "many"}, "gradient_accumulation_steps", "whole number"),
    ({"main_process_port": 0}, "main_process_port", "1 to 65535"),
    ({"main_process_port": 70000}, "main_process_port", "1 to 65535"),
    ({"main_process_port": "http"}, "main_process_port", "1 to 65535"),
    ({"main_process_ip": "not a host!"}, "main_process_ip", "IPv4/IPv6 address or a host name"),
    ({"gpu_ids": "0;1"}, "gpu_ids", "'all' or GPU indices"),
    ({"gpu_ids": "a,b"}, "gpu_ids", "'all' or GPU indices"),
    ({"gpu_ids": "0,0"}, "gpu_ids", "'all' or GPU indices"),
    ({"gpu_ids": [-1]}, "gpu_ids", "'all' or GPU indices"),
    ({"gpu_ids": 1.5}, "gpu_ids", "'all' or GPU indices"),
    ({"use_cpu": "maybe"}, "use_cpu", "true or false"),
    ({"same_network": 2}, "same_network", "true or false"),
    ({"start_method": "forkserver"}, "start_method", "auto, fork, spawn"),
    ({"rdzv_backend": "zookeeper"}, "rdzv_backend", "static, c10d"),
    ({"max_restarts": -1}, "max_restarts", ">= 0"),
    ({"dynamo_backend": "turbo"}, "dynamo_backend", "inductor"),
    ({"dynamo_mode": "fast"}, "dynamo_mode", "reduce-overhead"),
    ({"dynamo_use_dynamic": "sometimes"}, "dynamo_use_dynamic", "true or false"),
    # consistency between keys
    ({"distributed_type": "NO", "num_processes": 2}, "distributed_type", "MULTI_CPU or MULTI_GPU"),
    (
        {"distributed_type": "NO", "num_machines": 2, "main_process_ip": "h"},
        "distributed_type",
        "across machines",
    ),
    (
        {"distributed_type": "MULTI_GPU", "num_processes": 2, "use_cpu": True},
        "use_cpu",
        "false with distributed_type MULTI_GPU",
    ),
    (
        {"distributed_type": "MULTI_CPU", "num_processes": 3, "num_machines": 2, "main_process_ip": "h"},
        "num_processes",
        "multiple of num_machines=2",
    ),
    (
        {"distributed_type": "MULTI_CPU", "num_processes": 2, "num_machines": 2},
        "main_process_ip",
        "machine 0",
    ),
    (
        {"distributed_type": "MULTI_GPU", "num_processes": 4, "gpu_ids": "0,1"},
        "gpu_ids",
        "at least 4 GPU ids",
    ),
]


@pytest.mark.parametrize(
    "changes, key, allowed", BAD_VALUES, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_VALUES)]
)
def test_every_validation_error_names_key_value_and_allowed(changes, key, allowed, tmp_path):
    cfg = LaunchConfig(**changes)
    with pytest.raises(ConfigError) as err:
        cfg.validate(path=str(tmp_path / "f.yaml"))
    e = err.value
    assert e.key == key, str(e)
    assert allowed in str(e)
    if e.value is None or e.value == "":
        assert str(e).startswith(f"{key} in ") and " is empty" in str(e) and "None" not in str(e)
    else:
        assert str(e).startswith(f"{key}=")
    assert str(tmp_path / "f.yaml") in str(e)


GOOD_VALUES = [
    (
        {"distributed_type": "multi_cpu", "num_processes": "4"},
        {"distributed_type": "MULTI_CPU", "num_processes": 4},
    ),
    ({"mixed_precision": "FP16"}, {"mixed_precision": "fp16"}),
    ({"mixed_precision": None}, {"mixed_precision": "no"}),
    ({"gpu_ids": [0, 2]}, {"gpu_ids": "0,2"}),
    ({"gpu_ids": " 1, 3 "}, {"gpu_ids": "1,3"}),
    ({"gpu_ids": ""}, {"gpu_ids": "all"}),
    ({"main_process_ip": "fe80::1"}, {"main_process_ip": "fe80::1"}),
    ({"main_process_ip": "node-0.cluster.local"}, {"main_process_ip": "node-0.cluster.local"}),
    ({"main_process_port": "29501"}, {"main_process_port": 29501}),
    ({"use_cpu": "yes", "same_network": "false"}, {"use_cpu": True, "same_network": False}),
    (
        {
            "distributed_type": "MULTI_CPU",
            "num_processes": 4,
            "num_machines": 2,
            "machine_rank": 1,
            "main_process_ip": "192.168.0.1",
        },
        {"machine_rank": 1},
    ),
]


@pytest.mark.parametrize("changes, expected", GOOD_VALUES)
def test_valid_spellings_are_normalised(changes, expected):
    cfg = LaunchConfig(**changes).validate()
    for key, value in expected.items():
        assert getattr(cfg, key) == value


# ------------------------------------------------------------------ against the hardware


def test_check_hardware():
    cpu_only, t4s, a100s = (
        _hw(),
        _hw([_gpu(0, (7, 5), "Tesla T4"), _gpu(1, (7, 5), "Tesla T4")]),
        _hw([_gpu(0), _gpu(1)]),
    )
    with pytest.raises(ConfigError, match="no visible CUDA GPU"):
        LaunchConfig(distributed_type="MULTI_GPU", num_processes=2).validate().check_hardware(cpu_only)
    with pytest.raises(
        ConfigError, match=r"GPU 0 \(Tesla T4, compute capability 7.5\) does not support bf16"
    ):
        LaunchConfig(distributed_type="MULTI_GPU", num_processes=2, mixed_precision="bf16").check_hardware(
            t4s
        )
    with pytest.raises(ConfigError, match="3 processes per machine but 2 GPU"):
        LaunchConfig(distributed_type="MULTI_GPU", num_processes=3).check_hardware(a100s)
    with pytest.raises(ConfigError, match="GPU 5 does not exist"):
        LaunchConfig(distributed_type="MULTI_GPU", num_processes=1, gpu_ids="5").validate().check_hardware(
            a100s
        )
    assert (
        LaunchConfig(distributed_type="MULTI_GPU", num_processes=2, mixed_precision="bf16").check_hardware(
            a100s
        )
        == []
    )
    notes = LaunchConfig(
        distributed_type="MULTI_CPU", num_processes=2, mixed_precision="fp16"
    ).check_hardware(cpu_only)
    assert any("fp16" in n for n in notes)


# ------------------------------------------------------------------ defaults and helpers


def test_default_config_follows_the_hardware():
    cpu = default_config(_hw())
    assert (cpu.distributed_type, cpu.num_processes, cpu.mixed_precision, cpu.use_cpu) == (
        "NO",
        1,
        "no",
        True,
    )
    one = default_config(_hw([_gpu(0)]))
    assert (one.distributed_type, one.num_processes, one.mixed_precision, one.use_cpu) == (
        "NO",
        1,
        "bf16",
        False,
    )
    four = default_config(_hw([_gpu(i) for i in range(4)]))
    assert (four.distributed_type, four.num_processes, four.mixed_precision) == ("MULTI_GPU", 4, "bf16")
    t4 = default_config(_hw([_gpu(0, (7, 5)), _gpu(1, (7, 5))]))
    assert (t4.distributed_type, t4.num_processes, t4.mixed_precision) == ("MULTI_GPU", 2, "fp16")
    old = default_config(_hw([_gpu(0, (6, 1))]))
    assert old.mixed_precision == "no"
    tpu = default_config(_hw(xla_available=True, tpu_detected=True))
    assert tpu.distributed_type == "XLA"
    for cfg in (cpu, one, four, t4, old, tpu):
        cfg.validate()
    assert (
        default_config().mixed_precision != "fp16" or default_config().use_cpu is False
    )  # never fp16 on CPU


def test_replace_follows_the_process_count():
    base = LaunchConfig(use_cpu=True).validate()
    two = base.replace(num_processes=2)
    assert two.distributed_type == "MULTI_CPU" and base.num_processes == 1
    assert two.replace(num_processes=1).distributed_type == "NO"
    gpu = LaunchConfig(distributed_type="MULTI_GPU", num_processes=4).validate()
    assert gpu.replace(num_processes=2).distributed_type == "MULTI_GPU"
    assert gpu.replace(mixed_precision=None).mixed_precision == "no"  # None = keep
    with pytest.raises(ConfigError, match="mixed_precision"):
        base.replace(mixed_precision="fp9")


def test_to_env_for_ranks():
    env = (
        LaunchConfig(
            distributed_type="MULTI_GPU",
            num_processes=2,
            mixed_precision="bf16",
            gpu_ids="2,3",
            gradient_accumulation_steps=4,
        )
        .validate()
        .to_env()
    )
    assert env["ACCEL_NB_MIXED_PRECISION"] == env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCEL_NB_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    cpu_env = LaunchConfig(distributed_type="MULTI_CPU", num_processes=2).validate().to_env()
    assert cpu_env["ACCEL_NB_USE_CPU"] == "1" and "CUDA_VISIBLE_DEVICES" not in cpu_env


def test_config_module_is_light():
    import subprocess
    import sys

    code = "import sys, accel_nb.config as c; c.LaunchConfig().validate(); print('yaml' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert out.stdout.split() == ["False", "False"]
