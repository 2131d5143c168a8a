"""%%accelerate in a REAL Jupyter kernel: namespace in, names back, errors into the cell's code, flags."""

from __future__ import annotations

import os

import psutil
import pytest

from tests.cuda_pretend import KERNEL_PRETEND, KERNEL_STOP_PRETENDING
from tests.kernel_helpers import KernelSession
from tests.process_helpers import assert_no_descendants

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return str(tmp_path_factory.mktemp("accel_nb_config") / "default_config.yaml")


@pytest.fixture(scope="module")
def kernel(config_file):
    env = {"ACCEL_NB_PROGRESS": "text", "ACCEL_NB_CONFIG_FILE": config_file}
    with KernelSession(env=env) as k:
        out = k.run("%load_ext accel_nb\nimport os, time, threading\nimport torch", timeout=120)
        assert out.error is None, out.traceback
        yield k


def _assert_no_children(k: KernelSession, within: float = 5.0) -> None:
    assert_no_descendants(psutil.Process(k.pid), within)


def test_train_a_notebook_model_on_two_processes_and_use_it_in_the_next_cell(kernel):
    pytest.importorskip("accel_nb.accelerator")
    out = kernel.run(
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(1, 1)\n"
        "x = torch.linspace(-1, 1, 64).unsqueeze(1)\n"
        "dataset = torch.utils.data.TensorDataset(x, 2 * x - 1)\n"
        "def one_epoch(model, loader, opt, accelerator):\n"
        "    for xb, yb in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
        "        accelerator.backward(loss)\n"
        "        opt.step(); opt.zero_grad()\n"
        "    return accelerator.reduce(loss.detach(), reduction='mean').item()\n"
    )
    assert out.error is None, out.traceback
    out = kernel.run(
        "%%accelerate -n 2 --return model,history\n"
        "from accel_nb import Accelerator\n"
        "accelerator = Accelerator()\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
        "history = [one_epoch(model, loader, opt, accelerator) for _ in range(30)]\n"
        "model = accelerator.unwrap_model(model)\n"
        "accelerator.print('world', accelerator.num_processes, 'final loss', round(history[-1], 4))\n",
        timeout=180,
    )
    assert out.error is None, out.traceback
    assert out.stdout.startswith("Launching 2 CPU processes (gloo) with fork")
    assert "[rank 0] world 2 final loss" in out.stdout
    assert "model, history copied from rank 0" in out.stdout
    out = kernel.run(
        "pred = model(torch.tensor([[0.5]])).item()\n"
        "print('USE', type(model).__name__, len(history), history[-1] < 0.01, abs(pred - 0.0) < 0.1, model.weight.device)"
    )
    assert out.error is None, out.traceback
    assert "USE Linear 30 True True cpu" in out.stdout
    _assert_no_children(kernel)


def test_a_final_expression_is_shown_per_rank_like_a_cell_value(kernel):
    out = kernel.run(
        "%%accelerate -n 2\nfrom accel_nb import PartialState\n{'rank': PartialState().process_index}"
    )
    assert out.error is None, out.traceback
    assert "[rank 0] {'rank': 0}" in out.stdout and "[rank 1] {'rank': 1}" in out.stdout


def test_rank_choice_for_return_values(kernel):
    out = kernel.run(
        "%%accelerate -n 2 --rank 1 --return who\nfrom accel_nb import PartialState\nwho = PartialState().process_index\nprint('me', who)"
    )
    assert out.error is None, out.traceback
    assert "[rank 1] me 1" in out.stdout and "[rank 0]" not in out.stdout  # --rank 1: rank 1's view
    assert "who copied from rank 1" in out.stdout
    assert "1" == kernel.run("print(who)").stdout.strip()


def test_a_cell_raising_on_rank_1_points_into_the_cells_own_code(kernel):
    out = kernel.run(
        "%%accelerate -n 2\n"
        "from accel_nb import PartialState\n"
        "rank = PartialState().process_index\n"
        "if rank == 1:\n"
        "    raise RuntimeError(f'bad batch on rank {rank}')\n"
        "time.sleep(60)\n",
        timeout=120,
    )
    assert out.error is not None and out.error["ename"] == "LaunchError"
    tb = out.traceback
    assert "rank 1 (first to fail) failed: RuntimeError: bad batch on rank 1" in tb
    assert 'File "<accelerate-cell-' in tb and "line 5, in <module>" in tb
    assert "raise RuntimeError(f'bad batch on rank {rank}')" in tb  # the cell's line is shown
    assert "[rank 1] failed: RuntimeError" in out.stderr
    _assert_no_children(kernel)


def test_spawn_cell_after_torch_was_used_sees_the_namespace_and_skips_unpicklables(kernel):
    out = kernel.run(
        "base = torch.ones(3) * 2\n"
        "import math as m\n"
        "def double(v):\n"
        "    return v * factor\n"
        "factor = 2\n"
        "class Box:\n"
        "    def __init__(self, v): self.v = v\n"
        "lock = threading.Lock()\n" + KERNEL_PRETEND
    )
    assert out.error is None, out.traceback
    try:
        out = kernel.run(
            "%%accelerate -n 2 --return total,box\n"
            "from accel_nb import PartialState\n"
            "factor = 10\n"
            "total = float(double(base).sum()) + m.floor(PartialState().process_index + 0.5)\n"
            "box = Box(os.environ.get('ACCEL_NB_FORKED', 'spawned'))\n"
            "print('total', total)\n",
            timeout=180,
        )
        assert out.error is None, out.traceback
        assert "using spawn instead of fork: CUDA was initialised in this kernel" in out.stdout
        assert "not sent to the workers because they cannot be pickled: lock (" in out.stdout
        assert "[rank 1] total 61.0" in out.stdout  # functions read the cell's globals (factor = 10)
        check = kernel.run("print(total, box.v, type(box).__name__)")
        assert check.stdout.strip() == "60.0 spawned Box"
        out = kernel.run("%%accelerate -n 2\nwith lock:\n    pass\n", timeout=180)
        assert out.error is not None and out.error["ename"] == "LaunchError"
        assert "name 'lock' was not sent to the workers because it cannot be pickled" in out.traceback
    finally:
        kernel.run(KERNEL_STOP_PRETENDING)
    _assert_no_children(kernel)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("--bogus", "unrecognized arguments: --bogus"),
        ("-n 0", "argument -n/--num_processes"),
        ("-n two", "'two' is not a whole number"),
        ("--mixed_precision fp32", "invalid choice: 'fp32'"),
        ("--return 1abc", "is not a comma-separated list of Python names"),
        ("--rank first", "'first' is not a rank number or 'all'"),
        ("--timeout -1", "must be more than 0 seconds"),
    ],
)
def test_bad_flags_are_one_line_usage_errors_before_launching(kernel, line, expected):
    out = kernel.run(f"%%accelerate {line}\nprint('ran')")
    # IPython shows a UsageError as one line on stderr, without a traceback
    assert out.stderr.startswith("UsageError: %%accelerate: "), out.text
    assert expected in out.stderr
    assert "\n" not in out.stderr.strip()
    assert "Launching" not in out.stdout and "ran" not in out.stdout


def test_defaults_come_from_the_saved_config_and_accelerate_config_prints_it(kernel, config_file):
    out = kernel.run("%accelerate_config")
    assert "No saved launch config" in out.stdout
    from accel_nb.config import LaunchConfig, save_config

    save_config(
        LaunchConfig(
            distributed_type="MULTI_CPU", num_processes=2, use_cpu=True, gradient_accumulation_steps=4
        ),
        config_file,
    )
    try:
        out = kernel.run("%accelerate_config")
        assert f"Launch config from {config_file}" in out.stdout and "num_processes: 2" in out.stdout
        out = kernel.run(
            "%%accelerate --return steps\n"
            "from accel_nb import PartialState\n"
            "steps = (PartialState().num_processes, os.environ['ACCEL_NB_GRADIENT_ACCUMULATION_STEPS'])\n"
        )
        assert out.error is None, out.traceback
        assert out.stdout.startswith("Launching 2 CPU processes")
        assert kernel.run("print(steps)").stdout.strip() == "(2, '4')"
    finally:
        os.unlink(config_file)


def test_accelerate_env_prints_the_environment_report(kernel):
    out = kernel.run("%accelerate_env")
    assert out.error is None, out.traceback
    assert "accel_nb" in out.stdout and "PyTorch" in out.stdout


def test_a_cell_that_does_not_compile_is_rejected_before_any_process_starts(kernel):
    out = kernel.run("%%accelerate -n 2\nx = 1\nfor i in range(3)\n    print(i)\n")
    assert out.stderr.startswith("UsageError: %%accelerate: the cell does not compile, nothing was launched")
    assert "line 3: for i in range(3)" in out.stderr
    assert "Launching" not in out.stdout
    _assert_no_children(kernel)


def test_the_cell_label_is_the_cells_prompt_number(kernel):
    msg_id = kernel.kc.execute("%%accelerate -n 2\nraise ValueError('labelled')\n")
    out = kernel.collect(msg_id, timeout=120)
    prompt = [m["content"]["execution_count"] for m in out.messages if m["msg_type"] == "execute_input"][0]
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert f'File "<accelerate-cell-{prompt}>", line 2, in <module>' in out.traceback, (prompt, out.traceback)
    assert "accel_nb/" not in out.traceback  # none of the launcher's frames, here or in the ranks' part
    assert "run_cell_magic" not in out.traceback  # nor IPython's rewrite of the cell as one string
    _assert_no_children(kernel)


def test_return_of_a_value_that_cannot_travel_names_it(kernel):
    out = kernel.run("%%accelerate -n 2 --return ok,handle\nok = 1\nhandle = threading.Lock()\n")
    assert out.error is not None and out.error["ename"] == "LaunchError"
    assert "--return handle: rank 0's handle is a _thread.lock that cannot be sent back" in out.traceback
    assert "a dict" not in out.traceback
    _assert_no_children(kernel)


def test_the_saved_layout_reaches_the_cell_and_a_session_and_a_bad_one_stops_before_launching(
    kernel, config_file
):
    """Issue 30: a ``parallelism_config`` saved by ``accel-nb config`` or the wizard lays out the ranks of
    ``%%accelerate`` and of ``%accelerate start`` as ``accel-nb launch`` does (``Accelerator()`` in code)."""
    from accel_nb.config import LaunchConfig, save_config

    cfg = LaunchConfig(distributed_type="MULTI_CPU", num_processes=2, use_cpu=True)
    cfg.extras["parallelism_config"] = {"tp_size": 2}
    save_config(cfg.validate(), config_file)
    mesh = (
        "from accel_nb import Accelerator\n"
        "acc = Accelerator()\n"
        "m = acc.torch_device_mesh\n"
        "print('MESH', acc.process_index, m.mesh_dim_names, tuple(m.shape), acc.parallelism_config.tp_size)\n"
    )
    try:
        out = kernel.run("%%accelerate\n" + mesh, timeout=180)
        assert out.error is None, out.traceback
        assert out.stdout.startswith("Launching 2 CPU processes")
        assert "MESH 0 ('tp',) (2,) 2" in out.stdout and "MESH 1 ('tp',) (2,) 2" in out.stdout
        # sizes that do not multiply to the processes: the numbers, before any process starts
        out = kernel.run("%%accelerate -n 3\nprint('RAN')")
        assert out.stderr.startswith("UsageError: %%accelerate: nothing was launched: parallelism_config"), (
            out.text
        )
        assert "multiplies to 2 processes but this run has 3" in out.stderr and config_file in out.stderr
        assert "RAN" not in out.stdout and "Launching" not in out.stdout
        out = kernel.run("%accelerate start -n 3")
        assert out.stderr.startswith("UsageError: %accelerate start: nothing was launched"), out.text
        assert "multiplies to 2 processes but this run has 3" in out.stderr
        _assert_no_children(kernel)
        # a session of the saved 2 processes: its warm ranks build the same mesh
        out = kernel.run("%accelerate start", timeout=180)
        assert out.error is None, out.traceback
        try:
            out = kernel.run("%%accelerate\n" + mesh, timeout=180)
            assert out.error is None, out.traceback
            assert "MESH 0 ('tp',) (2,) 2" in out.stdout and "MESH 1 ('tp',) (2,) 2" in out.stdout
        finally:
            assert kernel.run("%accelerate stop", timeout=120).error is None
        _assert_no_children(kernel)
    finally:
        os.unlink(config_file)
