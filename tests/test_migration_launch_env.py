"""``accel_nb.utils.launch.prepare_multi_gpu_env`` side by side with the reference's: the same parsed launch
arguments give the ranks the same settings and fill ``args`` with the same torchrun names; the
environment it returns really launches ranks that read those settings."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")
from accelerate.commands.launch import launch_command_parser  # noqa: E402
from accelerate.utils.launch import prepare_multi_gpu_env as reference_env  # noqa: E402

from accel_nb.commands.main import build_parser  # noqa: E402
from accel_nb.utils.launch import prepare_multi_gpu_env  # noqa: E402

pytestmark = pytest.mark.multiproc

# what a rank reads, case-insensitively for the booleans ("False" in the reference, "false" here)
RANK_KEYS = (
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_DYNAMO_BACKEND",
    "ACCELERATE_DYNAMO_MODE",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH",
    "ACCELERATE_DYNAMO_USE_DYNAMIC",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
    "ACCELERATE_USE_FSDP",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "ACCELERATE_DEBUG_MODE",
)
TORCHRUN_NAMES = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint")


@pytest.fixture
def no_saved_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(tmp_path / "none.yaml"))


def _reference_args(flags: list[str]):
    """What ``accelerate launch`` hands to prepare_multi_gpu_env: parsed, then its defaults filled in."""
    from accelerate.commands.launch import _validate_launch_command  # the reference's own fill-in step

    args = launch_command_parser().parse_args([*flags, "train.py"])
    return _validate_launch_command(args)[0]


@pytest.mark.parametrize(
    "flags",
    [
        ["--multi_gpu", "--num_processes", "2", "--gpu_ids", "0,1", "--mixed_precision", "bf16", "--debug"],
        ["--multi_gpu", "--num_processes", "4", "--main_process_port", "29511", "--dynamo_backend", "eager"],
        [
            "--multi_gpu",
            "--num_processes",
            "4",
            "--num_machines",
            "2",
            "--machine_rank",
            "1",
            "--main_process_ip",
            "10.1.2.3",
            "--main_process_port",
            "1234",
        ],
        ["--multi_gpu", "--num_processes", "4", "--num_machines", "2", "--machine_rank", "1"]
        + ["--main_process_ip", "10.1.2.3", "--main_process_port", "1234", "--same_network"],
        ["--use_fsdp", "--num_processes", "2", "--num_cpu_threads_per_process", "3", "--fsdp_version", "2"],
    ],
    ids=["gpu_ids-bf16-debug", "port-dynamo", "two-machines", "two-machines-same-network", "fsdp"],
)
def test_the_same_parsed_arguments_give_the_ranks_the_reference_settings(flags, no_saved_config):
    ref_args = _reference_args(flags)
    our_args = copy.deepcopy(ref_args)
    before = dict(os.environ)
    ref_env, our_env = reference_env(ref_args), prepare_multi_gpu_env(our_args)
    assert {k: v for k, v in before.items() if k not in our_env} == {}  # os.environ is carried over
    for key in RANK_KEYS:
        theirs, ours = ref_env.get(key), our_env.get(key)
        assert (theirs or "").lower() == (ours or "").lower(), (key, theirs, ours)
    port_given = "--main_process_port" in flags
    for name in TORCHRUN_NAMES:
        if name != "master_port" or port_given:
            assert getattr(our_args, name, None) == getattr(ref_args, name, None), name
    if port_given:
        assert our_args.main_process_port == ref_args.main_process_port
    else:  # deliberate difference: a free port rather than 29500 (docs/migration.md)
        assert our_args.master_port == str(our_args.main_process_port) and our_args.main_process_port > 0
    if "--use_fsdp" in flags:  # accel_nb's ranks read one JSON value; the reference's FSDP_* are there too
        assert json.loads(our_env["ACCEL_NB_FSDP_CONFIG"])["fsdp_version"] == "2"
        theirs = {k: v.lower() for k, v in ref_env.items() if k.startswith("FSDP_")}
        assert theirs and {k: v.lower() for k, v in our_env.items() if k.startswith("FSDP_")} == theirs


def test_port_zero_becomes_a_free_port_in_both(no_saved_config):
    flags = ["--multi_gpu", "--num_processes", "2", "--main_process_port", "0"]
    ref_args = _reference_args(flags)
    our_args = copy.deepcopy(ref_args)
    reference_env(ref_args), prepare_multi_gpu_env(our_args)
    for args in (ref_args, our_args):
        assert args.main_process_port > 0 and args.master_port == str(args.main_process_port)


def test_a_bad_value_is_refused_naming_the_flag(no_saved_config):
    from accel_nb.config import ConfigError

    ns = build_parser().parse_args(["launch", "--num_processes", "2", "--cpu", "train.py"])
    ns.mixed_precision = "fp9"
    with pytest.raises(ConfigError, match="mixed_precision"):
        prepare_multi_gpu_env(ns)


RANK_SCRIPT = """
import json, os, sys
from accel_nb import Accelerator
acc = Accelerator()
out = {"mp": acc.mixed_precision, "n": acc.num_processes, "device": acc.device.type,
       "omp": os.environ.get("OMP_NUM_THREADS")}
with open(os.path.join(sys.argv[1], f"rank{acc.process_index}.json"), "w") as f:
    json.dump(out, f)
"""


def test_the_environment_launches_ranks_that_read_it(tmp_path, no_saved_config):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    ns = build_parser().parse_args(
        ["launch", "--num_processes", "2", "--cpu", "--mixed_precision", "bf16", str(script), str(tmp_path)]
    )
    ns.num_cpu_threads_per_process = 1  # the reference's flag, honoured when the namespace has it
    env = prepare_multi_gpu_env(ns)
    assert ns.nproc_per_node == "2"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", ns.nproc_per_node]
    # torchrun's own logs here, not a torchelastic_* folder left in /tmp
    cmd += ["--log_dir", str(tmp_path / "torchrun-logs")]
    cmd += ["--master_port", ns.master_port, str(script), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert ranks == [{"mp": "bf16", "n": 2, "device": "cpu", "omp": "1"}] * 2
