"""PartialState / AcceleratorState / GradientState: single process and real 2-rank gloo groups."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from accel_nb.state import (
    AcceleratorState,
    DistributedType,
    GradientState,
    PartialState,
    TopologyError,
    _reset_all_states,
    split_for_process,
    validate_mixed_precision,
)
from tests.dist_helpers import RanksFailed, free_port, run_ranks

TOPO_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(fresh_state):
    return fresh_state  # tests/conftest.py: no launch variables, fresh shared state


def test_single_process_defaults(clean_env):
    s = PartialState()
    assert s.num_processes == 1 and s.process_index == 0 and s.local_process_index == 0
    assert s.is_main_process and s.is_local_main_process and s.is_last_process
    assert s.distributed_type is DistributedType.NO and s.backend is None
    assert s.device == torch.device("cpu")
    assert PartialState().__dict__ is s.__dict__  # shared state
    s.wait_for_everyone()  # no-op


def test_state_reports_as_the_reference_prints_it(clean_env):
    # the reference's run_me.py prints accelerator.state; code and logs parse these lines
    assert repr(PartialState()) == (
        "Distributed environment: DistributedType.NO\nNum processes: 1\nProcess index: 0\n"
        "Local process index: 0\nDevice: cpu\n"
    )
    assert (
        str(AcceleratorState(mixed_precision="bf16"))
        == repr(PartialState()) + "\nMixed precision type: bf16\n"
    )


def test_rank_world_size_disagree(clean_env):
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "2")
    with pytest.raises(TopologyError, match=r"RANK=2 does not fit WORLD_SIZE=2"):
        PartialState()


def test_local_rank_out_of_range(clean_env):
    for k, v in {
        "WORLD_SIZE": "4",
        "RANK": "1",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
    }.items():
        clean_env.setenv(k, v)
    with pytest.raises(TopologyError, match="LOCAL_RANK=3 does not fit LOCAL_WORLD_SIZE=2"):
        PartialState()


def test_missing_master_addr(clean_env):
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "0")
    with pytest.raises(TopologyError, match="MASTER_ADDR/MASTER_PORT are not set"):
        PartialState()


def test_non_integer_rank(clean_env):
    clean_env.setenv("RANK", "zero")
    with pytest.raises(TopologyError, match="RANK='zero' is not an integer"):
        PartialState()


def test_mixed_precision_validation(clean_env):
    assert validate_mixed_precision("BF16") == "bf16"
    assert validate_mixed_precision(None) == "no"
    with pytest.raises(ValueError, match="choose one of no, fp16, bf16"):
        validate_mixed_precision("fp8x")
    clean_env.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # the reference library's spelling
    assert AcceleratorState().mixed_precision == "bf16"
    with pytest.raises(RuntimeError, match="cannot change"):
        AcceleratorState(mixed_precision="fp16")


def test_gradient_state_shared(clean_env):
    g = GradientState(gradient_accumulation_steps=4)
    assert GradientState().num_steps == 4 and g.sync_gradients and not g.end_of_dataloader


def test_reset_state_helpers_mean_what_the_references_do(clean_env):
    # issue 38, item 22: test suites reset the shared states between tests with the reference's private
    # helpers; a literal rename accelerate -> accel_nb must keep working
    import accelerate
    import accelerate.state

    import accel_nb
    import accel_nb.state

    seen = {}
    for top, mod in ((accelerate, accelerate.state), (accel_nb, accel_nb.state)):
        mod.AcceleratorState._reset_state(True)
        mod.GradientState._reset_state()
        steps = []
        acc = top.Accelerator(mixed_precision="bf16", cpu=True, gradient_accumulation_steps=3).state
        mod.AcceleratorState._reset_state()  # the training settings only
        steps.append((bool(mod.PartialState._shared_state), bool(mod.AcceleratorState._shared_state)))
        steps.append(top.Accelerator(mixed_precision="fp16", cpu=True).state.mixed_precision)
        mod.AcceleratorState._reset_state(True)  # and the topology
        steps.append((bool(mod.PartialState._shared_state), bool(mod.AcceleratorState._shared_state)))
        steps.append((acc.initialized, bool(mod.GradientState._shared_state)))  # GradientState kept
        mod.PartialState()
        mod.PartialState._reset_state()
        mod.GradientState._reset_state()
        steps.append((bool(mod.PartialState._shared_state), mod.GradientState().num_steps))
        mod.AcceleratorState._reset_state(reset_partial_state=True)
        mod.GradientState._reset_state()
        seen[top.__name__] = steps
    assert seen["accel_nb"] == seen["accelerate"]
    assert seen["accel_nb"] == [(True, False), "fp16", (False, False), (False, True), (False, 1)]


def test_accelerator_state_finds_a_reset_topology_again(clean_env, monkeypatch):
    # the reference's AcceleratorState copies PartialState's topology each time it is made: after
    # PartialState._reset_state() (what its own test_env_var_device does first), a new Accelerator sees
    # the device the environment names now, not the one of the state before the reset. Side by side.
    import accelerate
    import accelerate.state

    import accel_nb
    import accel_nb.state

    seen = {}
    for top, mod in ((accelerate, accelerate.state), (accel_nb, accel_nb.state)):
        mod.AcceleratorState._reset_state(True)
        mod.GradientState._reset_state()
        first = str(top.Accelerator(cpu=True).state.device)
        mod.PartialState._reset_state()  # the topology only: the AcceleratorState keeps its settings
        monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:64")
        again = top.Accelerator()
        seen[top.__name__] = (first, str(again.state.device), str(again.device), again.state.mixed_precision)
        monkeypatch.delenv("ACCELERATE_TORCH_DEVICE")
        mod.AcceleratorState._reset_state(True)
        mod.GradientState._reset_state()
    assert seen["accel_nb"] == seen["accelerate"] == ("cpu", "cpu:64", "cpu:64", "no")


@pytest.mark.parametrize(
    "n,parts,pad,expected",
    [
        (5, 2, False, [[0, 1, 2], [3, 4]]),
        (5, 2, True, [[0, 1, 2], [3, 4, 4]]),
        (2, 3, True, [[0], [1], [1]]),
        (6, 3, False, [[0, 1], [2, 3], [4, 5]]),
    ],
)
def test_split_for_process_lists(n, parts, pad, expected):
    data = list(range(n))
    assert [split_for_process(data, i, parts, pad) for i in range(parts)] == expected


def test_split_for_process_types():
    t = torch.arange(5)
    assert torch.equal(split_for_process(t, 1, 2, True), torch.tensor([3, 4, 4]))
    d = {"a": [1, 2, 3], "b": torch.tensor([4, 5, 6])}
    part = split_for_process(d, 1, 2)
    assert part["a"] == [3] and torch.equal(part["b"], torch.tensor([6]))
    assert split_for_process((1, 2, 3), 1, 2, True) == (3, 3)
    with pytest.raises(ValueError, match="same length"):
        split_for_process({"a": [1], "b": [1, 2]}, 0, 2)
    with pytest.raises(TypeError, match="list, tuple, tensor or dict"):
        split_for_process(7, 0, 2)


def test_split_for_process_of_a_datasets_dataset_gives_datasets():
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"x": list(range(5)), "y": [f"s{i}" for i in range(5)]})
    parts = [split_for_process(data, i, 2) for i in range(2)]
    assert all(isinstance(p, datasets.Dataset) for p in parts)
    assert [p["x"] for p in parts] == [[0, 1, 2], [3, 4]] and parts[1]["y"] == ["s3", "s4"]
    assert split_for_process(data, 1, 2, apply_padding=True)["x"] == [3, 4, 4]
    assert split_for_process(data, 2, 3, apply_padding=True)["x"] == [4, 4]


# -- real 2-rank gloo groups ----------------------------------------------------------------------
def _topology():
    s = PartialState()
    import torch.distributed as dist

    return (
        s.process_index,
        s.num_processes,
        s.local_process_index,
        s.distributed_type.value,
        s.backend,
        dist.get_world_size(),
        s.is_main_process,
        s.is_last_process,
    )


@pytest.mark.multiproc
def test_two_ranks_form_a_real_gloo_group():
    res = run_ranks(_topology, 2)
    assert res == [
        (0, 2, 0, "MULTI_CPU", "gloo", 2, True, False),
        (1, 2, 1, "MULTI_CPU", "gloo", 2, False, True),
    ]


def _ordering(path):
    s = PartialState()
    with s.main_process_first():
        with open(path, "a") as f:
            f.write(f"enter {s.process_index}\n")
        time.sleep(0.3 if s.is_main_process else 0)
        with open(path, "a") as f:
            f.write(f"leave {s.process_index}\n")
    s.wait_for_everyone()
    return open(path).read().split("\n")[:4]


@pytest.mark.multiproc
def test_main_process_first_ordering(tmp_path):
    path = str(tmp_path / "order.txt")
    res = run_ranks(_ordering, 2, args=(path,))
    assert res[0] == ["enter 0", "leave 0", "enter 1", "leave 1"]


def _barrier(path):
    s = PartialState()
    if s.process_index == 1:
        time.sleep(0.5)
        open(path, "w").write("late rank was here")
    s.wait_for_everyone()
    return os.path.exists(path)


@pytest.mark.multiproc
def test_wait_for_everyone(tmp_path):
    assert run_ranks(_barrier, 2, args=(str(tmp_path / "flag"),)) == [True, True]


def _split():
    s = PartialState()
    with s.split_between_processes(list(range(5)), apply_padding=True) as mine:
        a = mine
    with s.split_between_processes({"x": torch.arange(4)}) as mine:
        b = mine["x"].tolist()
    return a, b


@pytest.mark.multiproc
def test_split_between_processes():
    assert run_ranks(_split, 2) == [([0, 1, 2], [0, 1]), ([3, 4, 4], [2, 3])]


def _print_and_decorators():
    import contextlib
    import io

    s = PartialState()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        s.print("hello from", s.process_index)
    ran = []
    s.on_main_process(lambda: ran.append("main"))()
    s.on_process(lambda: ran.append("last"), process_index=1)()
    s.on_local_main_process(lambda: ran.append("local"))()
    s.on_last_process(lambda: ran.append("on_last"))()
    s.on_local_process(local_process_index=1)(lambda: ran.append("local 1"))()
    return buf.getvalue(), ran


@pytest.mark.multiproc
def test_print_and_decorators():
    res = run_ranks(_print_and_decorators, 2)
    assert res[0] == ("hello from 0\n", ["main", "local"])
    assert res[1] == ("", ["last", "on_last", "local 1"])
    # with one process every decorated function runs, as in the reference library
    assert run_ranks(_print_and_decorators, 1) == [
        ("hello from 0\n", ["main", "last", "local", "on_last", "local 1"])
    ]


def _triggers():
    from accel_nb import Accelerator

    accelerator = Accelerator(cpu=True)
    seen = []
    for step in range(4):
        if step == 1 and accelerator.process_index == 1:
            accelerator.set_trigger()  # one process alone raises it
        seen.append(accelerator.check_trigger())
    return seen


@pytest.mark.multiproc
def test_a_trigger_set_on_one_process_is_seen_by_all_once():
    assert run_ranks(_triggers, 2) == [[False, True, False, False]] * 2


def _destroy_and_rejoin():
    s = PartialState()
    first = s.num_processes
    s.destroy_process_group()
    import torch.distributed as dist

    return first, dist.is_initialized(), PartialState._shared_state == {}


@pytest.mark.multiproc
def test_destroy_process_group_resets():
    assert run_ranks(_destroy_and_rejoin, 2) == [(2, False, True), (2, False, True)]


_EXIT_SCRIPT = """
import atexit, os, torch.distributed as dist
# runs last; one write per rank (print's pieces from the two ranks interleaved once in CI)
atexit.register(lambda: os.write(1, f"group formed at exit: {dist.is_initialized()}\\n".encode()))
from accel_nb import PartialState
PartialState().wait_for_everyone()  # a script that never calls destroy_process_group
"""


@pytest.mark.multiproc
def test_a_gloo_group_left_formed_is_destroyed_before_the_interpreter_ends(tmp_path):
    """Left to finalization, gloo's threads can abort the process after its last line (SIGABRT)."""
    script = tmp_path / "leave_group.py"
    script.write_text(_EXIT_SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "--log_dir",  # torchrun's own logs: here, not a torchelastic_* folder left in /tmp
        str(tmp_path / "torchrun-logs"),
        str(script),
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=root)
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("group formed at exit: False") == 2, res.stdout


@pytest.mark.multiproc
def test_unreachable_master_is_a_clear_timeout(clean_env):
    """A non-main rank whose MASTER_ADDR:PORT has nobody listening fails within the limit."""
    port = free_port()
    env = dict(
        os.environ,
        RANK="1",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        ACCEL_NB_RENDEZVOUS_TIMEOUT="3",
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", "from accel_nb import PartialState; PartialState()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "RendezvousError" in proc.stderr
    assert f"rank 1 could not reach the main process at 127.0.0.1:{port} within 3 s" in proc.stderr
    assert elapsed < 30


@pytest.mark.multiproc
def test_missing_peer_is_a_clear_timeout(clean_env):
    """Rank 0 of 2 whose peer never comes gives up with a message, not a hang."""
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        ACCEL_NB_RENDEZVOUS_TIMEOUT="3",
    )
    proc = subprocess.run(
        [sys.executable, "-c", "from accel_nb import PartialState; PartialState()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode != 0
    assert "RendezvousError" in proc.stderr and "are all 2 ranks started?" in proc.stderr


def _bad_rank_in_child():
    os.environ["RANK"] = "5"
    _reset_all_states()
    PartialState()


@pytest.mark.multiproc
def test_errors_from_ranks_are_reported():
    with pytest.raises(RanksFailed, match="RANK=5 does not fit WORLD_SIZE=2"):
        run_ranks(_bad_rank_in_child, 2, timeout=60)
