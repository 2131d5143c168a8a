"""Two ranks on one GPU are refused before anything starts, by every face (NVML made to report one GPU).

NCCL only refuses a shared GPU inside every rank's DDP constructor ("Duplicate GPU detected"), after
the launch has started; the plan refuses it first and names the GPU count and the choices.
"""

from __future__ import annotations

import psutil
import pytest

from accel_nb import Session, notebook_launcher
from accel_nb.launch.errors import LaunchSetupError
from accel_nb.launch.options import LaunchOptions
from accel_nb.launch.plan import make_plan
from tests.cuda_pretend import kernel_pretend_gpus, pretend_gpus
from tests.kernel_helpers import KernelSession

REFUSAL = r"2 GPU processes asked, but this machine has 1 GPU and each GPU process needs a GPU of its own"


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _touch(path):
    with open(path, "w") as f:
        f.write("ran")


def test_notebook_launcher_refuses_two_gpu_ranks_on_one_gpu_before_anything_starts(monkeypatch, tmp_path):
    pretend_gpus(monkeypatch, 1)
    before = _children()
    marker = tmp_path / "ran"
    with pytest.raises(LaunchSetupError, match=REFUSAL) as err:
        notebook_launcher(_touch, args=(str(marker),), num_processes=2)
    text = str(err.value)
    assert "Use num_processes=1 (one process per GPU), cpu=True to run 2 CPU processes (gloo)" in text
    assert "or a machine with 2 GPUs" in text
    assert not marker.exists() and _children() <= before  # nothing ran, nothing was started
    # what the refusal offers is accepted: one GPU process, or CPU processes
    plan = make_plan(LaunchOptions(num_processes=1))
    assert plan.use_gpu and plan.num_processes == 1 and plan.backend == "nccl"
    assert make_plan(LaunchOptions(num_processes=2, cpu=True)).backend == "gloo"
    assert make_plan(LaunchOptions()).num_processes == 1  # no number: one per GPU


def test_two_gpus_take_two_ranks_but_not_three(monkeypatch):
    pretend_gpus(monkeypatch, 2)
    assert make_plan(LaunchOptions(num_processes=2)).num_processes == 2
    with pytest.raises(LaunchSetupError, match="3 GPU processes asked, but this machine has 2 GPUs") as err:
        make_plan(LaunchOptions(num_processes=3))
    assert "Use num_processes=2 (one process per GPU), cpu=True to run 3 CPU processes" in str(err.value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the GPUs this process may use count, not the machine's
    with pytest.raises(LaunchSetupError, match=REFUSAL):
        make_plan(LaunchOptions(num_processes=2))


def test_a_session_refuses_two_gpu_ranks_on_one_gpu(monkeypatch):
    pretend_gpus(monkeypatch, 1)
    before = _children()
    session = Session(num_processes=2)
    with pytest.raises(LaunchSetupError, match=REFUSAL):
        session.start()
    assert not session.running and _children() <= before


def test_accel_nb_launch_refuses_two_gpu_ranks_on_one_gpu(monkeypatch, tmp_path, capsys):
    from accel_nb.commands import main as cli

    pretend_gpus(monkeypatch, 1)
    monkeypatch.setenv("ACCEL_NB_CONFIG_FILE", str(tmp_path / "no_config.yaml"))
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    assert cli.main(["launch", "--num_processes", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert "accel-nb launch: error: 2 GPU processes asked, but this machine has 1 GPU" in err
    assert "Use --num_processes 1 (one process per GPU), --cpu to run 2 CPU processes (gloo)" in err
    assert "Traceback" not in err and not marker.exists()
    # the number from a config file: the refusal says where it came from
    config = tmp_path / "two.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert cli.main(["launch", "--config_file", str(config), str(script)]) == 2
    err = capsys.readouterr().err
    assert "2 GPU processes asked" in err and f"(num_processes=2 is from {config})" in err
    assert not marker.exists()


def test_the_magics_refuse_two_gpu_ranks_on_one_gpu_in_a_real_kernel(tmp_path):
    marker = tmp_path / "ran"
    with KernelSession(env={"ACCEL_NB_CONFIG_FILE": str(tmp_path / "no_config.yaml")}) as k:
        setup = k.run("%load_ext accel_nb\n" + kernel_pretend_gpus(1))
        assert setup.error is None, setup.traceback
        cell = k.run(f"%%accelerate -n 2\nopen({str(marker)!r}, 'w').write('ran')\n")
        assert cell.error is not None and cell.error["ename"] == "LaunchSetupError"
        assert "2 GPU processes asked, but this machine has 1 GPU" in cell.error["evalue"]
        assert "Use -n 1 (one process per GPU), --cpu to run 2 CPU processes (gloo)" in cell.error["evalue"]
        start = k.run("%accelerate start -n 2")
        assert start.error is not None and "Use -n 1 (one process per GPU), --cpu" in start.error["evalue"]
        assert "no session is running" in k.run("%accelerate status").stdout
        kids = k.run("import psutil, os\nprint(len(psutil.Process(os.getpid()).children(recursive=True)))")
        assert kids.stdout.strip() == "0"
    assert not marker.exists()
