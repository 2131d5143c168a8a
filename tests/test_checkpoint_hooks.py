"""save_state / load_state pre-hooks on 2 gloo ranks (DDP), side by side with accelerate: the hooks get
the user's modules (not the DDP wrapper) and plain weight names, so an adapter saved through
``save_pretrained`` in a save hook and restored through ``load_adapter`` in a load hook round-trips."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from tests.dist_helpers import run_ranks

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc


class AdapterNet(torch.nn.Module):
    """A model with the two methods hooks usually call on a PEFT/transformers model."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(3, 4)
        self.adapter = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.adapter(torch.relu(self.base(x)))

    def save_pretrained(self, folder, state_dict=None):
        state = self.state_dict() if state_dict is None else state_dict
        os.makedirs(folder, exist_ok=True)
        torch.save(
            {k: v for k, v in state.items() if k.startswith("adapter.")}, os.path.join(folder, "adapter.pt")
        )

    def load_adapter(self, folder):
        state = torch.load(os.path.join(folder, "adapter.pt"), weights_only=True)
        self.load_state_dict(state, strict=False)


def _adapter_round_trip(library, folder):
    torch.manual_seed(0)
    acc = importlib.import_module(library).Accelerator(cpu=True)
    model = acc.prepare(AdapterNet())
    seen = []

    def save_hook(models, weights, output_dir):
        seen.append(("save", [type(m).__name__ for m in models], [sorted(w) for w in weights]))
        for m in models:
            state = weights.pop()
            if acc.is_main_process:
                m.save_pretrained(os.path.join(output_dir, "adapter"), state_dict=state)

    def load_hook(models, input_dir):
        seen.append(("load", [type(m).__name__ for m in models]))
        while models:
            m = models.pop()
            if hasattr(m, "load_adapter"):
                m.load_adapter(os.path.join(input_dir, "adapter"))
                seen.append("adapter loaded")

    acc.register_save_state_pre_hook(save_hook)
    acc.register_load_state_pre_hook(load_hook)
    saved = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    acc.save_state(folder)
    acc.wait_for_everyone()
    with torch.no_grad():
        acc.unwrap_model(model).adapter.weight.zero_()
    acc.load_state(folder)
    now = acc.unwrap_model(model).state_dict()
    return type(model).__name__, seen, torch.equal(now["adapter.weight"], saved["adapter.weight"])


def test_state_pre_hooks_get_the_unwrapped_models_like_the_reference(tmp_path):
    ours = run_ranks(_adapter_round_trip, 2, args=("accel_nb", str(tmp_path / "ours")))
    theirs = run_ranks(_adapter_round_trip, 2, args=("accelerate", str(tmp_path / "theirs")))
    assert ours == theirs
    wrapped, seen, restored = ours[0]
    assert wrapped == "DistributedDataParallel" and restored
    assert seen == [
        ("save", ["AdapterNet"], [["adapter.bias", "adapter.weight", "base.bias", "base.weight"]]),
        ("load", ["AdapterNet"]),
        "adapter loaded",
    ]
