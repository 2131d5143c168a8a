"""notebook_launcher and %%accelerate on XLA devices: XLA's CPU backend with 2 devices (threads of one process).

Runs only in the XLA environment (``bash scripts/setup-xla-env.sh``, then
``.venv-xla/bin/python -m pytest -q -p no:cacheprovider tests/xla``); the main environment
skips this file. The launch contract is the one of CPU and GPU launches: each ordinal's result in
ordinal order, output and progress labelled by ordinal, the first failure raised with the
user's traceback, and no process left behind.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap
import time

import pytest

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed here (run in .venv-xla)", allow_module_level=True)

from accel_nb import notebook_launcher  # noqa: E402
from accel_nb.events import Progress  # noqa: E402
from accel_nb.launch.errors import LaunchError, LaunchSetupError  # noqa: E402
from accel_nb.launch.parent.reporting import ListReporter  # noqa: E402

XLA_CPU_2 = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}


@pytest.fixture
def two_xla_devices(monkeypatch):
    for name, value in XLA_CPU_2.items():
        monkeypatch.setenv(name, value)


def train_linear(steps: int = 4) -> dict:
    """A tiny data-parallel regression on the XLA device; every ordinal starts from the same weights."""
    import torch
    from torch import nn

    from accel_nb import Accelerator
    from accel_nb.progress_bar import progress

    accelerator = Accelerator()
    model = nn.Linear(4, 1)
    with torch.no_grad():  # devices may be threads sharing one RNG: initialise explicitly
        model.weight.copy_(torch.linspace(-0.5, 0.5, 4).view(1, 4))
        model.bias.zero_()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.arange(32.0).view(8, 4) / 32
    y = x.sum(1, keepdim=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    for _ in progress(range(steps), desc="train"):
        xb, yb = x[rank::world].to(accelerator.device), y[rank::world].to(accelerator.device)
        loss = ((model(xb) - yb) ** 2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print(f"ordinal {rank} of {world} on {accelerator.device}")
    weight = accelerator.unwrap_model(model).weight.detach().cpu()
    return {
        "rank": rank,
        "world": world,
        "type": str(accelerator.distributed_type),
        "weight": weight.tolist(),
    }


@pytest.mark.multiproc
def test_notebook_launcher_trains_on_every_xla_device_and_returns_each_result(two_xla_devices):
    reporter = ListReporter()
    results = notebook_launcher(train_linear, args=(4,), reporter=reporter)
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert {r["type"] for r in results} == {"DistributedType.XLA"}
    assert results[0]["weight"] == results[1]["weight"]  # gradients were reduced across the devices
    import torch

    start = [torch.linspace(-0.5, 0.5, 4).tolist()]
    # and the model did train
    assert all(abs(a - b) > 1e-4 for a, b in zip(results[0]["weight"][0], start[0]))
    assert reporter.started[0] == 2 and reporter.finished == (True, None)
    for rank in (0, 1):  # what each ordinal printed and its progress came back under its own rank
        assert f"ordinal {rank} of 2 on xla:" in reporter.output(rank)
    finished = {e.rank for e in reporter.of_type(Progress) if e.done and e.n == 4}
    assert finished == {0, 1}


def ordinal_and_pid() -> tuple:
    import torch_xla.runtime as xr

    print(f"ordinal {xr.global_ordinal()} here")
    return xr.global_ordinal(), os.getpid()


@pytest.mark.multiproc
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_torch_xla_may_fork_or_spawn_its_processes_from_the_host(two_xla_devices, monkeypatch, method):
    monkeypatch.setenv("ACCEL_NB_XLA_START_METHOD", method)
    reporter = ListReporter()
    results = notebook_launcher(ordinal_and_pid, reporter=reporter)
    assert [r[0] for r in results] == [0, 1] and results[0][1] == results[1][1] != os.getpid()
    assert "ordinal 0 here" in reporter.output(0) and "ordinal 1 here" in reporter.output(1)


def fails_on_ordinal_1() -> None:
    import time

    import torch_xla.runtime as xr

    if xr.global_ordinal() == 1:
        raise ValueError("boom on ordinal 1")
    time.sleep(600)  # ordinal 0 would wait forever: the launch must stop it


@pytest.mark.multiproc
def test_a_failing_ordinal_raises_its_traceback_and_nothing_is_left_running(two_xla_devices):
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(LaunchError) as info:
        notebook_launcher(fails_on_ordinal_1, reporter=ListReporter())
    text = str(info.value)
    assert "rank 1 (first to fail) failed: ValueError: boom on ordinal 1" in text
    assert 'raise ValueError("boom on ordinal 1")' in text and "in fails_on_ordinal_1" in text
    assert "rank 0 was stopped" in text
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    # the warm spawn server stays, by design
    left = [p for p in left if "zygote" not in " ".join(p.cmdline())]
    assert left == []


def crashes_in_native_code() -> None:
    import ctypes

    ctypes.string_at(0)  # a segmentation fault in the ordinal's process


@pytest.mark.multiproc
@pytest.mark.parametrize("method", ["fork", "spawn", "spawn+PYTHONFAULTHANDLER"])
def test_an_ordinal_process_that_crashes_is_reported_with_its_stack(two_xla_devices, monkeypatch, method):
    method, _, faulthandler_env = method.partition("+")
    monkeypatch.setenv("ACCEL_NB_XLA_START_METHOD", method)
    if faulthandler_env:  # the ordinal processes start with faulthandler on, writing to stderr
        monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    with pytest.raises(LaunchError) as info:
        notebook_launcher(crashes_in_native_code, reporter=ListReporter())
    text = str(info.value)
    assert "OrdinalProcessDied" in text and "ended abruptly" in text
    assert "in crashes_in_native_code" in text  # where the process was when it crashed


def test_a_process_count_other_than_the_device_count_is_refused(two_xla_devices):
    with pytest.raises(LaunchSetupError, match=r"num_processes=3 but this XLA runtime has 2 devices"):
        notebook_launcher(train_linear, num_processes=3)
    # the launch's env= is what the host gets: three devices there are three ranks here
    assert (
        notebook_launcher(ordinal_and_pid, env={"CPU_NUM_DEVICES": "3"}, reporter=ListReporter())[2][0] == 2
    )
    assert notebook_launcher(os.getpid, cpu=True, num_processes=1)[0] != os.getpid()  # cpu=True: a CPU launch


@pytest.mark.kernel
def test_in_a_real_kernel_launcher_and_magic_run_on_xla_devices():
    from tests.kernel_helpers import KernelSession

    with KernelSession(env=XLA_CPU_2) as k:
        out = k.run(
            textwrap.dedent("""
            from accel_nb import notebook_launcher

            def where(scale):
                import torch, torch_xla
                import torch_xla.runtime as xr
                t = torch.ones(2, device=torch_xla.device()) * (xr.global_ordinal() + 1) * scale
                print("hello from ordinal", xr.global_ordinal())
                return t.cpu().tolist()

            print("results:", notebook_launcher(where, args=(3,)))
            """),
            timeout=240,
        )
        assert out.error is None, out.traceback
        assert "results: [[3.0, 3.0], [6.0, 6.0]]" in out.stdout
        out = k.run(
            textwrap.dedent("""
            def fails(n):
                import torch_xla.runtime as xr
                if xr.global_ordinal() == n:
                    raise KeyError(f"no key on ordinal {n}")
                import time; time.sleep(600)

            notebook_launcher(fails, args=(1,))
            """),
            timeout=240,
        )
        assert out.error is not None and out.error["ename"] == "LaunchError"
        assert "KeyError: 'no key on ordinal 1'" in out.traceback
        assert 'raise KeyError(f"no key on ordinal {n}")' in out.traceback  # the cell's own line
        assert k.children() == [] or all("zygote" in " ".join(p.cmdline()) for p in k.children())
        msg_id = k.kc.execute(
            textwrap.dedent("""
            def forever():
                import time
                import torch_xla.runtime as xr
                print("waiting on ordinal", xr.global_ordinal(), flush=True)
                time.sleep(600)

            notebook_launcher(forever, progress="text")
            """)
        )
        seen = k.wait_for_text(msg_id, "waiting on ordinal", count=2, timeout=180)
        assert "waiting on ordinal 0" in seen and "waiting on ordinal 1" in seen
        k.interrupt()  # the stop button
        out = k.collect(msg_id, timeout=60)
        assert out.error is not None and out.error["ename"] == "KeyboardInterrupt"
        assert "interrupted: every rank was stopped" in out.stderr
        time.sleep(2)
        assert k.children() == [] or all("zygote" in " ".join(p.cmdline()) for p in k.children())
        assert k.run("%load_ext accel_nb").error is None
        out = k.run(
            textwrap.dedent("""
            %%accelerate --return total
            import torch, torch_xla
            import torch_xla.runtime as xr
            total = float((torch.ones(3, device=torch_xla.device()) * xr.world_size()).sum().cpu())
            """).strip(),
            timeout=240,
        )
        assert out.error is None, out.traceback
        out = k.run("print('total in the notebook:', total)")
        assert "total in the notebook: 6.0" in out.stdout


def test_accel_nb_env_shows_the_xla_runtime_it_would_launch_on():
    import subprocess
    import sys

    env = dict(os.environ, **XLA_CPU_2)
    out = subprocess.run(
        [sys.executable, "-m", "accel_nb.commands", "env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "- TPU/XLA: no TPU, torch_xla installed" in out.stdout
    assert "- XLA launch: XLA CPU runtime, 2 devices (PJRT_DEVICE=CPU, CPU_NUM_DEVICES=2)" in out.stdout


def test_a_notebook_that_opened_the_tpu_itself_is_told_to_restart():
    import subprocess
    import sys

    code = textwrap.dedent("""
        import torch_xla
        from accel_nb.launch.errors import LaunchSetupError
        from accel_nb.launch.options import LaunchOptions
        from accel_nb.launch.xla.launcher import choose_xla, runtime_started_here

        assert not runtime_started_here()
        torch_xla.device()  # starts the runtime in this process, as a notebook cell would
        assert runtime_started_here()
        assert choose_xla(LaunchOptions()) is not None  # the CPU backend: a runtime here holds no chip
        try:
            choose_xla(LaunchOptions(), env={"PJRT_DEVICE": "TPU", "TPU_ACCELERATOR_TYPE": "v5litepod-1"}, installed=True)
        except LaunchSetupError as exc:
            print("refused:", exc)
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, **XLA_CPU_2),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "refused: this notebook's process already opened the TPU" in out.stdout
        and "restart the kernel" in out.stdout
    )
