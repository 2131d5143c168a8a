"""accel_nb on XLA devices, with real torch_xla on XLA's CPU backend (PJRT_DEVICE=CPU).

Each test runs a program of ``tests/xla/xla_programs.py`` in a fresh process, on two devices
(``CPU_NUM_DEVICES=2``: torch_xla runs them as two threads of that process) or one. Only collected
where torch_xla imports (see conftest.py):

    bash scripts/setup-xla-env.sh
    .venv-xla/bin/python -m pytest -q -p no:cacheprovider tests/xla
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

pytestmark = pytest.mark.slow


def run_program(name: str, out_dir: str, devices: int, **env: str) -> list[dict]:
    """Run program ``name`` on ``devices`` XLA CPU devices; every device's JSON result, by rank."""
    full_env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    # a crash (a signal, XLA's own abort) prints the stacks of every thread: torch_xla's process pool only
    # says "terminated abruptly" (CI saw that once, with nothing else to go on)
    full_env.update(
        PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices), PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1", **env
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.xla.xla_programs", name, str(out_dir)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, (
        f"{name} on {devices} XLA devices failed:\n{crash_report(proc.stdout + proc.stderr)}"
    )
    prefix = (
        f"{name}_{env['XLA_TEST_PHASE']}"
        if "XLA_TEST_PHASE" in env
        else name + env.get("XLA_TEST_ACCUMULATION", "")
    )
    return [json.load(open(os.path.join(out_dir, f"{prefix}_rank{r}.json"))) for r in range(devices)]


_CRASH = re.compile(
    r"rendezvous\.cc|Fatal Python error|Check failed|terminate called|F\d{4} |Aborted|Segmentation"
)


def crash_report(output: str, context: int = 40) -> str:
    """What a failed program printed that says why: the lines from the first crash sign on (XLA's own
    abort, docs/tpu.md; a fatal signal's thread stacks), then the last 30 lines (the pool's traceback)."""
    lines = output.splitlines()
    first = next((i for i, line in enumerate(lines[:-30]) if _CRASH.search(line)), None)
    crash = [] if first is None else [*lines[first : min(first + context, len(lines) - 30)], "[...]"]
    return "\n".join(crash + lines[-30:])


def assert_weights_close(a: dict, b: dict, atol: float = 1e-5) -> None:
    """Same weights; by default to float32 rounding of a different summation order (CI saw 2.4e-6
    between 2 devices and 1 after 8 steps; a doubled gradient moves them by ~0.1 with this clip)."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(torch.tensor(a[k]), torch.tensor(b[k]), atol=atol, rtol=0, msg=k)


def test_collectives_on_two_devices(tmp_path):
    results = run_program("ops", tmp_path, devices=2)
    for rank, res in enumerate(results):
        assert res["distributed_type"] == "XLA" and res["num_processes"] == 2
        assert res["device"] == f"xla:{rank}" and res["is_main_process"] == (rank == 0)
        assert res["gather"] == [1.0, 10.0, 2.0, 20.0]
        assert res["gather_scalar"] == [0.0, 1.0]
        assert res["gather_nested"] == {"a": [1.0, 10.0, 2.0, 20.0], "b": [1, 10, 2, 20]}
        assert res["sum"] == [3.0, 30.0] and res["mean"] == [1.5, 15.0] and res["max"] == [2.0, 20.0]
        assert res["broadcast"] == [2.0, 20.0]  # from process 1, on both
        assert res["gather_object"] == ["rank0", "rank1"]
        assert res["cpu_tensor_gather"] == [0, 1]  # a CPU tensor comes back on the CPU
    # rank 0 holds one row, rank 1 two: both padded to two rows
    assert results[0]["pad"] == [[1.0, 1.0], [0.0, 0.0]] and results[1]["pad"] == [[2.0, 2.0], [2.0, 2.0]]
    assert results[0]["pad_first"] == [[-1.0, -1.0], [1.0, 1.0]]


def test_two_devices_train_like_one_device_with_the_double_batch(tmp_path):
    for folder in ("two", "one", "accumulated"):
        (tmp_path / folder).mkdir()
    two = run_program("train", tmp_path / "two", devices=2)  # 4 samples per device and step
    one = run_program("train", tmp_path / "one", devices=1)  # 8 samples per step
    # 2 samples per device and micro-batch, 2 micro-batches accumulated per step: 8 samples a step again
    accumulated = run_program("train", tmp_path / "accumulated", devices=2, XLA_TEST_ACCUMULATION="2")
    # the parallel loader's
    assert two[0]["batch_devices"] == ["xla:0"] and two[1]["batch_devices"] == ["xla:1"]
    assert two[0]["model_class"] == "Sequential"  # no DDP wrapper on XLA devices
    assert two[0]["steps_per_epoch"] == one[0]["steps_per_epoch"] == 4
    assert_weights_close(two[0]["weights"], two[1]["weights"], atol=0)  # the devices agree exactly
    assert_weights_close(two[0]["weights"], one[0]["weights"])  # and with one device, 8 samples a step
    assert two[0]["losses"] == pytest.approx(one[0]["losses"], abs=1e-5)
    # clip_grad_norm_ returns the norm of the averaged gradient: the one device's, step by step
    assert len(two[0]["norms"]) == 8 and two[0]["norms"] == pytest.approx(one[0]["norms"], rel=1e-4)
    # some steps clipped
    assert any(n < 1.0 for n in one[0]["norms"]) and any(n > 1.0 for n in one[0]["norms"])
    assert accumulated[0]["norms"] == pytest.approx(one[0]["norms"], rel=1e-4)
    assert accumulated[0]["steps_per_epoch"] == 8  # micro-batches
    assert_weights_close(accumulated[0]["weights"], accumulated[1]["weights"], atol=0)
    assert_weights_close(accumulated[0]["weights"], one[0]["weights"])
    for res in two + one:  # gather_for_metrics over 30 samples: the padding of the last round is dropped
        assert res["eval_rows"] == 30
    assert two[0]["eval_loss"] == pytest.approx(one[0]["eval_loss"], abs=1e-6)
    losses = two[0]["losses"]  # two epochs of the same 4 batches: the second epoch's are lower (it trained)
    assert all(later < first for first, later in zip(losses[:4], losses[4:]))


def test_checkpoint_round_trip_on_two_devices(tmp_path):
    saved = run_program("checkpoint", tmp_path, devices=2, XLA_TEST_PHASE="save")
    loaded = run_program("checkpoint", tmp_path, devices=2, XLA_TEST_PHASE="load")
    for rank in (0, 1):
        assert len(saved[rank]["losses"]) == 2
        assert loaded[rank]["losses"] == saved[rank]["losses"]  # the same two steps after the checkpoint
        assert loaded[rank]["lr"] == saved[rank]["lr"]
        assert_weights_close(loaded[rank]["weights"], saved[rank]["weights"], atol=0)
    # written from the main device only, as CPU tensors that load without torch_xla
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "checkpoint.json",
        "model.safetensors",
        "optimizer.bin",
        "rank_0.pt",
        "rank_1.pt",
        "scheduler.bin",
    ]
    optimizer_state = torch.load(ckpt / "optimizer.bin", weights_only=True)
    assert all(t.device.type == "cpu" for s in optimizer_state["state"].values() for t in s.values())
    assert "xla" in torch.load(ckpt / "rank_1.pt", weights_only=True)["rng"]
    # save_model's file loads into a plain CPU model
    from safetensors.torch import load_file

    from tests.xla.xla_programs import _model

    plain = _model()
    plain.load_state_dict(load_file(str(tmp_path / "model" / "model.safetensors")))
    assert_weights_close({k: v.tolist() for k, v in plain.state_dict().items()}, saved[0]["saved"], atol=0)


def test_bf16_autocasts_on_the_xla_device_and_fp16_fsdp_compile_are_refused(tmp_path):
    (result,) = run_program("precision", tmp_path, devices=1)
    assert result["inner"] == "torch.bfloat16" and result["output"] == "torch.float32"
    assert "fp16" in result["fp16_error"] and "use mixed_precision='bf16'" in result["fp16_error"]
    assert "FSDP" in result["fsdp"] and "not supported on XLA devices" in result["fsdp"]
    assert "torch.compile" in result["compile"] and "not supported on XLA devices" in result["compile"]


def test_import_stays_light_and_cpu_true_stays_off_xla():
    code = (
        "import sys, accel_nb; from accel_nb import PartialState; "
        "s = PartialState(cpu=True); "
        "print(s.distributed_type.value, 'torch_xla' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["NO", "False"]


def test_a_device_that_skips_a_collective_gives_a_clear_error_not_a_hang(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="2", PYTHONPATH=ROOT, ACCEL_NB_COLLECTIVE_TIMEOUT="5")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.xla.xla_programs", "skipped_collective", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode != 0
    assert "XLA device 0 waited for the other device threads at a collective" in proc.stderr
    assert "Every rank must call the same collectives in the same order" in proc.stderr
