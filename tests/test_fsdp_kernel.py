"""FSDP from a %%accelerate cell in a REAL Jupyter kernel: the classes defined in the notebook are the
auto-wrap units, each rank holds about half of the weights, and the full weights come back to the kernel."""

from __future__ import annotations

import os

import pytest

from tests.kernel_helpers import KernelSession

pytestmark = [pytest.mark.kernel, pytest.mark.multiproc]


def test_an_accelerate_cell_trains_a_notebook_model_with_fsdp(tmp_path):
    env = {"ACCEL_NB_PROGRESS": "text", "ACCEL_NB_CONFIG_FILE": str(tmp_path / "none.yaml")}
    with KernelSession(env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) as kernel:
        out = kernel.run(
            "%load_ext accel_nb\n"
            "import torch\n"
            "class Block(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__(); self.lin = torch.nn.Linear(8, 8)\n"
            "    def forward(self, x):\n"
            "        return x + torch.tanh(self.lin(x))\n"
            "x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))\n"
            "dataset = torch.utils.data.TensorDataset(x, x.flip(1))\n",
            timeout=120,
        )
        assert out.error is None, out.traceback
        out = kernel.run(
            "%%accelerate -n 2 --return weights,share,kind,losses\n"
            "from accel_nb import Accelerator, FSDPOptions\n"
            "from accel_nb.fsdp.sharding import local_shard_bytes\n"
            "accelerator = Accelerator(fsdp=FSDPOptions(auto_wrap_classes=['Block']))\n"
            "torch.manual_seed(0)\n"
            "model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(8, 8))\n"
            "full = sum(p.numel() * p.element_size() for p in model.parameters())\n"
            "opt = torch.optim.AdamW(model.parameters(), lr=0.01)\n"
            "loader = torch.utils.data.DataLoader(dataset, batch_size=8)\n"
            "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "losses = []\n"
            "for _ in range(5):\n"
            "    for xb, yb in loader:\n"
            "        loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
            "        accelerator.backward(loss); opt.step(); opt.zero_grad()\n"
            "    losses.append(accelerator.reduce(loss.detach(), 'mean').item())\n"
            "share = local_shard_bytes(model.parameters()) / full\n"
            "kind = accelerator.distributed_type.value\n"
            "weights = accelerator.get_state_dict(model)\n",
            timeout=240,
        )
        assert out.error is None, out.traceback
        out = kernel.run(
            "plain = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(8, 8))\n"
            "plain.load_state_dict(weights)\n"
            "print('RESULT', kind, share, losses[-1] < losses[0])\n"
        )
        assert out.error is None, out.traceback
        assert "RESULT FSDP 0.5 True" in out.stdout
        # the saved config's distributed_type: FSDP reaches the cell's ranks, as it does accel-nb launch's
        (tmp_path / "none.yaml").write_text(
            "distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n"
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Block\n"
        )
        out = kernel.run(
            "%%accelerate --return kind,share\n"
            "from accel_nb import Accelerator\n"
            "from accel_nb.fsdp.sharding import local_shard_bytes\n"
            "accelerator = Accelerator()\n"
            "model = torch.nn.Sequential(Block(), Block())\n"
            "full = sum(p.numel() * p.element_size() for p in model.parameters())\n"
            "model = accelerator.prepare(model)\n"
            "share = local_shard_bytes(model.parameters()) / full\n"
            "kind = accelerator.distributed_type.value\n",
            timeout=240,
        )
        assert out.error is None, out.traceback
        assert "Launching 2 CPU processes" in out.stdout
        assert "RESULT FSDP 0.5" in kernel.run("print('RESULT', kind, share)").stdout
