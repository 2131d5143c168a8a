"""DeepSpeed from a REAL Jupyter kernel: notebook_launcher runs a ZeRO-3 training function defined in the
notebook on 2 CPU processes, and a %%accelerate cell picks up a saved DEEPSPEED launch config."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.kernel_helpers import KernelSession

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.multiproc,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (pip install 'accel_nb[deepspeed]')",
    ),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_notebook_launcher_and_an_accelerate_cell_train_with_deepspeed(tmp_path):
    env = {
        "ACCEL_NB_PROGRESS": "text",
        "ACCEL_NB_CONFIG_FILE": str(tmp_path / "none.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    with KernelSession(env=env, cwd=ROOT) as kernel:
        out = kernel.run(
            "%load_ext accel_nb\n"
            "import torch\n"
            "from accel_nb import Accelerator, DeepSpeedPlugin, notebook_launcher\n"
            "x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))\n"
            "dataset = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())\n"
            "def make_model():\n"
            "    torch.manual_seed(0)\n"
            "    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))\n"
            "def train(stage):\n"
            "    plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True)\n"
            "    accelerator = Accelerator(deepspeed_plugin=plugin)\n"
            "    model = make_model()\n"
            "    opt = torch.optim.AdamW(model.parameters(), lr=0.01)\n"
            "    loader = torch.utils.data.DataLoader(dataset, batch_size=8)\n"
            "    model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "    for xb, yb in loader:\n"
            "        accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb)); opt.step(); opt.zero_grad()\n"
            "    held = sum(p.ds_tensor.numel() for p in model.module.parameters())\n"
            "    full = sum(p.numel() for p in make_model().parameters())\n"
            "    return accelerator.distributed_type.value, held / full, accelerator.get_state_dict(model)\n",
            timeout=120,
        )
        assert out.error is None, out.traceback
        out = kernel.run(
            "import os\n"
            "results = notebook_launcher(train, args=(3,), num_processes=2, cpu=True)\n"
            "plain = make_model(); plain.load_state_dict(results[0][2])\n"
            "probe = torch.linspace(-1, 1, 16).reshape(2, 8)\n"
            "print('RESULT', [r[0] for r in results], [round(r[1], 2) for r in results],\n"
            "      not torch.equal(plain(probe), make_model()(probe)))\n",
            timeout=600,
        )
        assert out.error is None, out.traceback
        assert "RESULT ['DEEPSPEED', 'DEEPSPEED'] [0.5, 0.5] True" in out.stdout, out.stdout
        # the saved config's distributed_type: DEEPSPEED reaches a %%accelerate cell's ranks
        (tmp_path / "none.yaml").write_text(
            "distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\ndeepspeed_config:\n  zero_stage: 2\n"
        )
        out = kernel.run(
            "%%accelerate --return kind,stage,engine\n"
            "accelerator = Accelerator()\n"
            "model = make_model(); opt = torch.optim.AdamW(model.parameters(), lr=0.01)\n"
            "loader = torch.utils.data.DataLoader(dataset, batch_size=8)\n"
            "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "for xb, yb in loader:\n"
            "    accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb)); opt.step(); opt.zero_grad()\n"
            "kind, stage, engine = accelerator.distributed_type.value, accelerator.deepspeed_plugin.zero_stage, "
            "type(model).__name__\n",
            timeout=600,
        )
        assert out.error is None, out.traceback
        assert "Launching 2 CPU processes" in out.stdout
        assert (
            "RESULT DEEPSPEED 2 DeepSpeedEngine" in kernel.run("print('RESULT', kind, stage, engine)").stdout
        )
        # a warm session: DeepSpeed cells run, run again, and change stage on the same workers, the
        # namespace kept between them, and no per-step warning flood in the cell
        (tmp_path / "none.yaml").write_text("num_processes: 2\nuse_cpu: true\n")
        out = kernel.run("%accelerate start -n 2 --cpu", timeout=300)
        assert out.error is None, out.traceback
        out = kernel.run("%accelerate push make_model dataset", timeout=120)
        assert out.error is None, out.traceback
        cell = (
            "%%accelerate\n"
            "import torch\n"
            "from accel_nb import Accelerator, DeepSpeedPlugin\n"
            "accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=STAGE))\n"
            "model = make_model(); opt = torch.optim.AdamW(model.parameters(), lr=0.01)\n"
            "loader = torch.utils.data.DataLoader(dataset, batch_size=8)\n"
            "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "losses = []\n"
            "for xb, yb in loader:\n"
            "    loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
            "    accelerator.backward(loss); opt.step(); opt.zero_grad(); losses.append(round(loss.item(), 6))\n"
            "runs = globals().get('runs', 0) + 1\n"
            "print('RESULT', runs, type(model).__name__, accelerator.process_index, losses)\n"
        )
        seen = {}
        for stage in (2, 2, 3):
            out = kernel.run(cell.replace("STAGE", str(stage)), timeout=600)
            assert out.error is None, out.traceback
            assert "deprecated" not in out.text, out.text
            lines = [line.split("RESULT ", 1)[1] for line in out.stdout.splitlines() if "RESULT " in line]
            assert len(lines) == 2, out.stdout
            for line in lines:
                runs, engine, rank, losses = line.split(" ", 3)
                assert engine == "DeepSpeedEngine", line
                seen.setdefault(rank, []).append((int(runs), losses))
        for got in seen.values():
            assert [r for r, _ in got] == [1, 2, 3], got  # one namespace across the cells
            assert got[0][1] == got[1][1] == got[2][1], got  # a rerun and ZeRO-3 train the same
        assert seen["0"][0][1] != seen["1"][0][1]  # each rank trained on its own shard of the data
        out = kernel.run("%accelerate stop", timeout=120)
        assert out.error is None and "the session was stopped" in out.stdout, out.text
