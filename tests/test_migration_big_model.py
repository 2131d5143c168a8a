"""Big-model keywords and names code written for the reference uses, side by side with the reference."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")


class ReadsChildWeights(nn.Module):
    """Uses ``inner``'s weights without calling ``inner``: offloading per module leaves them on meta."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)
        self.other = nn.Linear(3, 3)

    def forward(self, x):
        return self.other(x @ self.inner.weight.T + self.inner.bias)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), ReadsChildWeights(), nn.Linear(3, 2))


@pytest.mark.parametrize("library", ["accel_nb", "accelerate"])
@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_preload_module_classes_brings_in_a_whole_subtree(library, kind, tmp_path):
    big_modeling = importlib.import_module(f"{library}.big_modeling")
    x = torch.randn(2, 3)
    expected = _model()(x)

    def offload(model, **kwargs):
        if kind == "cpu":
            return big_modeling.cpu_offload(model, execution_device="cpu", **kwargs)
        return big_modeling.disk_offload(model, str(tmp_path / f"off{len(kwargs)}"), execution_device="cpu", **kwargs)

    plain = _model()
    offload(plain)
    with pytest.raises(RuntimeError):  # the child's weights are still on the meta device
        plain(x)
    model = _model()
    offload(model, preload_module_classes=["ReadsChildWeights"])
    assert model[1].inner.weight.device.type == "meta"  # between forwards the weights stay off the model
    assert torch.allclose(model(x), expected)
    assert torch.allclose(model(x), expected)  # and again: the unit goes back and comes in again


def test_cpu_offload_refuses_a_state_dict_it_would_not_use():
    from accel_nb.big_modeling import cpu_offload

    with pytest.raises(ValueError, match="load them into the model first"):
        cpu_offload(_model(), execution_device="cpu", state_dict={})
