"""accel-nb tpu-config, to-fsdp2, estimate-memory, test and env's reference names, run as real commands on real files."""

from __future__ import annotations

import argparse
import itertools
import os
import warnings

import pytest
import yaml

from accel_nb.commands.env import env_command, env_command_parser
from accel_nb.commands.estimate import estimate_command_parser, estimate_training_usage, gather_data
from accel_nb.commands.to_fsdp2 import convert_config_to_fsdp2
from accel_nb.commands.tpu import gcloud_command, tpu_command_parser
from accel_nb.config import LaunchConfig
from tests.test_cli import accel_nb

FSDP1 = {
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_backward_prefetch": "BACKWARD_PRE",
    "fsdp_forward_prefetch": False,
    "fsdp_offload_params": False,
    "fsdp_sharding_strategy": "SHARD_GRAD_OP",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    "fsdp_sync_module_states": True,
    "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
    "fsdp_use_orig_params": True,
}


def write(path, data) -> str:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    return str(path)


def test_tpu_config_prints_the_gcloud_command_with_debug(tmp_path):
    commands = tmp_path / "setup.sh"
    commands.write_text("pip install -r requirements.txt\necho ready\n")
    config = write(tmp_path / "c.yaml", {"distributed_type": "XLA", "tpu_name": "pod", "tpu_zone": "z1"})
    out = accel_nb(
        "tpu-config", "--config_file", config, "--command_file", str(commands), "--debug", cfg=config
    )
    assert out.returncode == 0, out.stderr
    assert (
        "Running gcloud compute tpus tpu-vm ssh pod --zone z1 --command cd /usr/share; "
        "pip install -r requirements.txt; echo ready --worker all" in out.stdout
    )
    ns = tpu_command_parser().parse_args(
        ["--tpu_name", "t", "--tpu_zone", "z", "--command", "ls", "/tmp", "--command", "pwd", "--use_alpha"]
    )
    ns.config_file = config  # flags win over the file's tpu_name / tpu_zone
    ns.install_accelerate, ns.accelerate_version = True, "1.15.0"
    cmd = gcloud_command(ns)
    assert cmd[:7] == ["gcloud", "alpha", "compute", "tpus", "tpu-vm", "ssh", "t"]
    assert cmd[-4:] == [
        "--command",
        "cd /usr/share; pip install accelerate==1.15.0; ls /tmp; pwd",
        "--worker",
        "all",
    ]


def test_tpu_config_says_what_is_missing(tmp_path):
    empty = str(tmp_path / "none.yaml")
    out = accel_nb("tpu-config", "--tpu_name", "t", "--tpu_zone", "z", cfg=empty)
    assert out.returncode == 2 and "nothing to run" in out.stderr
    out = accel_nb("tpu-config", "--command", "ls", "--tpu_zone", "z", cfg=empty)
    assert out.returncode == 2 and "--tpu_name" in out.stderr
    out = accel_nb(
        "tpu-config",
        "--command",
        "ls",
        "--tpu_name",
        "t",
        "--tpu_zone",
        "z",
        cfg=empty,
        env={"PATH": "/nonexistent"},
    )
    assert out.returncode == 2 and "gcloud (the Google Cloud CLI) is not installed" in out.stderr


def test_to_fsdp2_converts_a_file_that_accel_nb_then_reads_without_fsdp1_warnings(tmp_path):
    source = write(
        tmp_path / "fsdp1.yaml", {"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": FSDP1}
    )
    target = str(tmp_path / "fsdp2.yaml")
    out = accel_nb("to-fsdp2", "--config_file", source, "--output_file", target, cfg=source)
    assert out.returncode == 0, out.stderr
    converted = yaml.safe_load(open(target))["fsdp_config"]
    assert converted == {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_offload_params": False,
        "fsdp_reshard_after_forward": False,  # SHARD_GRAD_OP keeps the parameters after forward
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_version": 2,
    }
    for key in (
        "fsdp_backward_prefetch",
        "fsdp_sync_module_states",
        "fsdp_use_orig_params",
        "fsdp_forward_prefetch",
    ):
        assert f"Argument {key}" in out.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "FSDP1 only" warning is left
        LaunchConfig.load(target)
    # an existing output is not replaced without --overwrite; --overwrite rewrites the source itself
    again = accel_nb("to-fsdp2", "--config_file", source, "--output_file", target, cfg=source)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert accel_nb("to-fsdp2", "--config_file", source, "--overwrite", cfg=source).returncode == 0
    assert yaml.safe_load(open(source))["fsdp_config"]["fsdp_version"] == 2
    missing = accel_nb("to-fsdp2", "--config_file", str(tmp_path / "nope.yaml"), "--overwrite", cfg=source)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_to_fsdp2_leaves_an_fsdp2_config_and_one_without_fsdp_alone():
    already = {"fsdp_config": {"fsdp_version": 2, "fsdp_sharding_strategy": "FULL_SHARD"}}
    assert convert_config_to_fsdp2(dict(already)) == already
    assert convert_config_to_fsdp2({"distributed_type": "NO"}) == {"distributed_type": "NO"}


@pytest.fixture
def tiny_bert(tmp_path) -> str:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    config.save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


def test_estimate_memory_of_a_local_config_matches_the_real_model(tiny_bert):
    import transformers

    real = transformers.BertModel(transformers.BertConfig.from_pretrained(tiny_bert))
    total = sum(t.numel() * t.element_size() for t in itertools.chain(real.parameters(), real.buffers()))
    args = estimate_command_parser().parse_args([tiny_bert, "--dtypes", "float32", "int4"])
    (f32, largest, size, training), (i4, largest4, size4, _) = gather_data(args)
    assert (f32, i4) == ("float32", "int4")
    assert size == total and size4 == total / 8 and 0 < largest < total and largest4 == largest / 8
    assert training == estimate_training_usage(total, "float32") and max(training.values()) == total * 4
    out = accel_nb("estimate-memory", tiny_bert, cfg=os.path.join(tiny_bert, "none.yaml"))
    assert out.returncode == 0, out.stderr
    assert f"Memory Usage for loading `{tiny_bert}`" in out.stdout
    for dtype in ("float32", "float16", "int8", "int4"):
        assert dtype in out.stdout


def test_estimate_memory_of_a_hub_name_offline_says_so(tmp_path):
    out = accel_nb(
        "estimate-memory", "some-org/some-model", cfg=str(tmp_path / "c.yaml"), env={"HF_HUB_OFFLINE": "1"}
    )
    assert (
        out.returncode == 2
        and "cannot reach the Hugging Face Hub" in out.stderr
        and "config.json" in out.stderr
    )


@pytest.mark.multiproc
def test_accel_nb_test_launches_the_self_check_on_two_processes(tmp_path):
    config = write(
        tmp_path / "c.yaml", {"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True}
    )
    out = accel_nb("test", "--config_file", config, cfg=str(tmp_path / "none.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "accel_nb self-check passed on 2 process(es), device cpu" in out.stdout
    assert "Test is a success!" in out.stdout


def test_env_command_reports_the_reference_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(tmp_path / "none.yaml"))
    info = env_command(env_command_parser().parse_args([]))
    assert info["PyTorch version"] and info["Platform"] and info["`Accelerate` version"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert env_command(argparse.Namespace(config_file=None))["`accelerate` bash location"] == "Not found"
    assert "Launch config: none saved" in capsys.readouterr().out
