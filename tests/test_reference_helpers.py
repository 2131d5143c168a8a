"""Small helpers of the reference that code written for it imports, with the reference's meaning
(checked side by side where the reference is installed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accel_nb.utils import get_model_tp_size


def _models():
    plain = torch.nn.Linear(2, 2)
    old_style = torch.nn.Linear(2, 2)
    old_style.tp_size = 2  # transformers 4 keeps the degree on the model
    new_style = torch.nn.Linear(2, 2)
    new_style.tp_size = None  # transformers 5 leaves a None stub and moves the degree to the config
    new_style.config = SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))
    from_json = torch.nn.Linear(2, 2)
    from_json.config = SimpleNamespace(distributed_config={"tp_size": 8})
    return [plain, old_style, new_style, from_json]


def test_get_model_tp_size_reads_both_transformers_generations():
    assert [get_model_tp_size(m) for m in _models()] == [None, 2, 4, 8]


def test_get_model_tp_size_matches_the_reference():
    reference = pytest.importorskip("accelerate.utils")
    assert [get_model_tp_size(m) for m in _models()] == [reference.get_model_tp_size(m) for m in _models()]
