"""The reference's launcher internals on accel_nb: ``launch_command_parser``, ``_validate_launch_command``,
``launch_command``, ``prepare_simple_launcher_cmd_env`` and ``config_args`` (the config file as dataclasses).

Real files and real launches; ``mpirun`` is a real executable written into the test's PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from accel_nb.commands.config.config_args import (
    BaseConfig,
    ClusterConfig,
    SageMakerConfig,
    load_config_from_file,
)
from accel_nb.commands.launch import _validate_launch_command, launch_command, launch_command_parser
from accel_nb.config.values import ComputeEnvironment
from accel_nb.state import DistributedType
from accel_nb.utils.launch import prepare_simple_launcher_cmd_env
from tests.test_cli import accel_nb


@pytest.fixture
def no_saved_config(tmp_path, monkeypatch) -> str:
    """No saved config: ACCEL_NB_CONFIG_FILE points at a file that does not exist."""
    path = str(tmp_path / "saved" / "default_config.yaml")
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", path)
    return path


def write(path, data) -> str:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    return str(path)


def test_parser_takes_hyphens_and_underscores_and_lists_underscores_only():
    parser = launch_command_parser()
    a = parser.parse_args(["--multi-gpu", "--num-processes", "4", "--use-fsdp", "t.py", "--lr", "1"])
    b = parser.parse_args(["--multi_gpu", "--num_processes", "4", "--use_fsdp", "t.py", "--lr", "1"])
    assert vars(a) == vars(b)
    assert a.multi_gpu and a.use_fsdp and a.num_processes == 4
    assert a.training_script == "t.py" and a.training_script_args == ["--lr", "1"]
    assert a.nondefault == {
        "multi_gpu",
        "num_processes",
        "use_fsdp",
        "training_script",
        "training_script_args",
    }
    text = parser.format_help()
    assert "--num_processes" in text and "--config_file" in text and "--multi_gpu" in text
    assert "--config-file" not in text and "--main-process-ip" not in text
    # what accel_nb does not run is parsed but not listed
    assert parser.parse_args(["--downcast_bf16", "t.py"]).downcast_bf16 is True
    assert "downcast" not in text and "--tpu_cluster" not in text and "--fp8_backend" not in text


def test_a_flag_accel_nb_does_not_run_is_refused_with_the_reason(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    out = accel_nb("launch", "--downcast_bf16", str(script), cfg=str(tmp_path / "none.yaml"))
    assert out.returncode == 2 and "ran" not in out.stdout
    assert "--downcast_bf16" in out.stderr and "XLA_DOWNCAST_BF16) is not supported by accel_nb" in out.stderr


def test_validate_fills_from_the_config_file_and_given_flags_win(tmp_path, no_saved_config):
    config = write(
        tmp_path / "c.yaml",
        {
            "distributed_type": "NO",
            "debug": True,
            "num_processes": 1,
            "mixed_precision": "bf16",
            "fsdp_config": {"fsdp_sync_module_states": False, "reshard_after_forward": "false"},
            "deepspeed_config": {"deepspeed_config_file": "from_config.json", "zero_stage": 2},
        },
    )
    args = launch_command_parser().parse_args(
        ["--num-processes", "2", "--deepspeed_config_file", "given.json", "--config_file", config, "t.py"]
    )
    assert args.debug is False and args.fsdp_sync_module_states == "true"
    args, defaults, mixed_from_config = _validate_launch_command(args)
    assert isinstance(defaults, ClusterConfig) and defaults.distributed_type == DistributedType.NO
    assert (
        args.debug is True
        and args.num_processes == 2
        and args.mixed_precision == "bf16"
        and mixed_from_config
    )
    assert args.fsdp_sync_module_states is False and args.fsdp_reshard_after_forward == "false"
    assert args.deepspeed_config_file == "given.json" and args.zero_stage == 2
    assert args.multi_gpu is False and args.use_fsdp is False and args.gpu_ids == "all"


def test_validate_without_a_config_takes_this_machines_defaults(no_saved_config):
    args, defaults, mixed_from_config = _validate_launch_command(launch_command_parser().parse_args(["t.py"]))
    assert defaults is None and not mixed_from_config
    assert args.num_processes == 1 and args.num_machines == 1 and args.mixed_precision == "no"
    assert args.use_cpu is False and args.debug is False and args.dynamo_backend == "no"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--multi_gpu", "--use_fsdp"], "exclude each other"),
        (["--multi_gpu", "--num_processes", "1"], "at least 2 processes"),
    ],
)
def test_validate_refuses_contradicting_flags(flags, message, no_saved_config):
    with pytest.raises(ValueError, match=message):
        _validate_launch_command(launch_command_parser().parse_args([*flags, "t.py"]))


def test_validate_and_launch_refuse_a_config_with_unknown_keys(tmp_path, no_saved_config):
    config = write(tmp_path / "c.yaml", {"distributed_type": "NO", "bogus_key": 1, "another": 2})
    args = launch_command_parser().parse_args(["--config_file", config, str(tmp_path / "t.py")])
    with pytest.raises(ValueError, match=r"unknown keys \(\['another', 'bogus_key'\]\)"):
        launch_command(args)


def test_launch_command_runs_the_script_and_raises_for_a_failing_one(tmp_path, no_saved_config):
    marker = tmp_path / "ran.txt"
    good = tmp_path / "good.py"
    good.write_text(
        f"import os, sys\nopen({str(marker)!r}, 'w').write(os.environ['RANK'] + ' ' + sys.argv[1])\n"
    )
    before = dict(os.environ)
    launch_command(launch_command_parser().parse_args(["--cpu", str(good), "hello"]))
    assert marker.read_text() == "0 hello"
    assert dict(os.environ) == before  # the ranks' variables do not stay in the caller's environment
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError) as info:
        launch_command(launch_command_parser().parse_args(["--cpu", str(bad)]))
    assert info.value.returncode == 3


def test_simple_launcher_command_and_environment(no_saved_config):
    parser = launch_command_parser()
    args, _, _ = _validate_launch_command(
        parser.parse_args(["--cpu", "--mixed_precision", "bf16", "t.py", "-x"])
    )
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd == [sys.executable, "t.py", "-x"]
    assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and env["KMP_BLOCKTIME"] == "1"
    assert env["ACCELERATE_USE_CPU"] == "True" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCEL_NB_MIXED_PRECISION"] == "bf16"
    args, _, _ = _validate_launch_command(parser.parse_args(["-m", "pkg.train"]))
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd == [sys.executable, "-m", "pkg.train"] and "KMP_AFFINITY" not in env
    assert env["ACCELERATE_USE_CPU"] == "False"


@pytest.mark.parametrize(
    "version, expected",
    [
        (
            "mpirun (Open MPI) 4.1.2",
            ["mpirun", "--hostfile", "/h", "--npernode", "4", "-n", "16", "--bind-to", "socket"],
        ),
        ("Intel(R) MPI Library 2021", ["mpirun", "-f", "/h", "-ppn", "4", "-n", "16"]),
    ],
)
def test_simple_launcher_with_an_mpirun_hostfile(tmp_path, monkeypatch, no_saved_config, version, expected):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mpirun"
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = write(
        tmp_path / "mpi.yaml",
        {
            "distributed_type": "MULTI_CPU",
            "use_cpu": True,
            "num_processes": 16,
            "num_machines": 4,
            "main_process_ip": "127.0.0.1",
            "main_process_port": 29500,
            "mpirun_config": {"mpirun_hostfile": "/h"},
        },
    )
    args, _, _ = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", config, "t.py"])
    )
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd == [*expected, sys.executable, "t.py"]
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29500"
    with pytest.raises(ValueError, match="not mpirun"):  # accel-nb launch itself does not run mpirun
        launch_command(launch_command_parser().parse_args(["--config_file", config, "t.py"]))


def test_config_args_reads_yaml_and_json_and_writes_them_back(tmp_path):
    data = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "num_processes": 2,
        "mixed_precision": "bf16",
        "fsdp_config": {"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT"},
        "gradient_accumulation_steps": 4,  # accel_nb's own keys are read too
        "start_method": "spawn",
    }
    cfg = load_config_from_file(write(tmp_path / "c.yaml", data))
    assert isinstance(cfg, ClusterConfig) and cfg.distributed_type == DistributedType.FSDP
    assert cfg.compute_environment == ComputeEnvironment.LOCAL_MACHINE
    assert (
        cfg.use_cpu is False and cfg.debug is False and cfg.deepspeed_config == {} and cfg.num_machines == 1
    )
    out = cfg.to_dict()
    assert (
        out["distributed_type"] == "FSDP"
        and "deepspeed_config" not in out
        and out["gradient_accumulation_steps"] == 4
    )
    cfg.to_json_file(str(tmp_path / "c.json"))
    assert json.load(open(tmp_path / "c.json"))["fsdp_config"] == data["fsdp_config"]
    again = load_config_from_file(str(tmp_path / "c.json"))
    assert again == cfg
    cfg.to_yaml_file(str(tmp_path / "back.yaml"))
    assert load_config_from_file(str(tmp_path / "back.yaml")) == cfg


def test_config_args_reads_older_files_sagemaker_and_refuses_bad_ones(tmp_path):
    old = load_config_from_file(write(tmp_path / "old.yaml", {"distributed_type": "TPU", "fp16": True}))
    assert old.distributed_type == DistributedType.XLA and old.mixed_precision == "fp16"
    sm = load_config_from_file(
        write(
            tmp_path / "sm.yaml",
            {
                "compute_environment": "AMAZON_SAGEMAKER",
                "distributed_type": "DATA_PARALLEL",
                "ec2_instance_type": "t",
                "iam_role_name": "r",
                "mixed_precision": "no",
            },
        )
    )
    assert isinstance(sm, SageMakerConfig) and sm.region == "us-east-1"
    assert BaseConfig("LOCAL_MACHINE", "NO", "no", False, False).distributed_type == DistributedType.NO
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config_from_file(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="no distributed_type"):
        load_config_from_file(write(tmp_path / "none.yaml", {"num_processes": 1}))


def test_a_file_accel_nb_config_wrote_reads_as_a_cluster_config(tmp_path):
    saved = str(tmp_path / "saved.yaml")
    out = accel_nb("config", "default", "--config_file", saved, cfg=saved)
    assert out.returncode == 0, out.stderr
    assert isinstance(load_config_from_file(saved), ClusterConfig)


def test_an_fsdp_config_with_one_process_launches_with_a_warning(tmp_path):
    """The reference's own config files have FSDP on one process: accel-nb launch reads and runs them."""
    config = write(
        tmp_path / "fsdp1.yaml",
        {"distributed_type": "FSDP", "num_processes": 1, "fsdp_config": {"fsdp_ignored_modules": None}},
    )
    script = tmp_path / "t.py"
    script.write_text("import os\nprint('fsdp env:', os.environ['ACCELERATE_USE_FSDP'])\n")
    out = accel_nb("launch", "--config_file", config, str(script), cfg=str(tmp_path / "none.yaml"))
    assert out.returncode == 0, out.stderr
    assert "fsdp env: true" in out.stdout
    assert "distributed_type: FSDP with num_processes=1" in out.stderr and "shards nothing" in out.stderr


def test_quiet_is_taken_and_says_once_that_it_changes_nothing(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    out = accel_nb(
        "launch", "--quiet", "--cpu", "--num_processes", "1", str(script), cfg=str(tmp_path / "none.yaml")
    )
    assert out.returncode == 0, out.stderr
    assert "ran" in out.stdout and out.stderr.count("--quiet changes nothing here") == 1
