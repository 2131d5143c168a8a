"""DeepSpeed ZeRO through Accelerator.prepare on 2 real CPU processes (gloo, DS_ACCELERATOR=cpu).

Each launch runs several configurations one after the other in the same two ranks (importing
DeepSpeed costs seconds), and the test compares what they returned.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed (the ranks are forked)
deepspeed = pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install 'accel_nb[deepspeed]')")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from tests.dist_helpers import run_ranks  # noqa: E402

STEPS_PER_EPOCH = 20  # batches per rank per epoch; with accumulation 2 and 2 epochs: 20 optimizer steps
BATCH = 4
ACCUMULATION = 2
CLIP = 0.5
LR = 1e-2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
    )


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2 * STEPS_PER_EPOCH * BATCH, 8, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def _fresh_state() -> None:
    from accel_nb.state import _reset_all_states

    _reset_all_states()


def _state_numel(optimizer) -> int:
    """Elements of optimizer state tensors this rank holds (in the torch optimizer ZeRO wraps, if any)."""
    inner = optimizer.optimizer  # the ZeRO optimizer (or the torch one without DeepSpeed)
    inner = getattr(inner, "optimizer", inner)  # ZeRO keeps the torch optimizer it drives here
    return sum(t.numel() for s in inner.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0)


def _train(plugin_kwargs):
    """Train 2 epochs with accumulation and clipping; the losses, and how much state this rank holds."""
    from accel_nb import Accelerator
    from accel_nb.deepspeed import DeepSpeedPlugin

    _fresh_state()
    plugin = None if plugin_kwargs is None else DeepSpeedPlugin(gradient_clipping=CLIP, **plugin_kwargs)
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, deepspeed_plugin=plugin)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    loader = DataLoader(_data(), batch_size=BATCH)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses, norms = [], []
    for _ in range(2):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    full = sum(p.numel() for p in _model().parameters())
    out = {"losses": losses, "norms": norms, "opt_state": _state_numel(optimizer), "full": full,
           "lr": scheduler.get_last_lr()[0], "type": type(accelerator.distributed_type).__name__}  # fmt: skip
    if plugin is not None:
        out["engine"] = type(model).__name__
        out["distributed_type"] = accelerator.distributed_type.value
        out["params_held"] = sum(getattr(p, "ds_tensor", p).numel() for p in model.module.parameters())
        out["unwrapped"] = type(accelerator.unwrap_model(model)).__name__
    return out


def _all_modes():
    return {
        "ddp": _train(None),
        "zero1": _train({"zero_stage": 1}),
        "zero2": _train({"zero_stage": 2}),
        "zero3": _train({"zero_stage": 3}),
        "zero2_offload": _train({"zero_stage": 2, "offload_optimizer_device": "cpu"}),
    }


@pytest.fixture(scope="module")
def trained():
    return run_ranks(_all_modes, world_size=2, timeout=900)


def _close(a, b):
    assert len(a) == len(b)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["zero1", "zero2", "zero3", "zero2_offload"])
def test_zero_stages_train_like_ddp_with_accumulation_and_clipping(trained, mode):
    for rank in trained:
        ddp, ds = rank["ddp"], rank[mode]
        assert ds["engine"] == "DeepSpeedEngine" and ds["distributed_type"] == "DEEPSPEED"
        assert ds["unwrapped"] == "Sequential"
        assert len(ds["losses"]) == 2 * STEPS_PER_EPOCH and len(ds["norms"]) == STEPS_PER_EPOCH
        _close(ds["losses"], ddp["losses"])
        _close(ds["norms"], ddp["norms"])  # the norm before clipping, as torch's clip_grad_norm_ returns it
        assert ds["lr"] == pytest.approx(ddp["lr"])
    # the runs really moved (and clipping really bit: the first norms are above CLIP)
    assert trained[0]["ddp"]["losses"][-1] < trained[0]["ddp"]["losses"][0]
    assert max(trained[0]["ddp"]["norms"]) > CLIP


@pytest.mark.parametrize("mode", ["zero1", "zero2", "zero3", "zero2_offload"])
def test_each_rank_holds_about_half_of_the_optimizer_state(trained, mode):
    for rank in trained:
        full_state = rank["ddp"]["opt_state"]
        assert full_state == 2 * rank["ddp"]["full"]  # AdamW: exp_avg and exp_avg_sq per parameter
        assert abs(rank[mode]["opt_state"] - full_state / 2) <= 0.02 * full_state, rank[mode]["opt_state"]


def test_zero3_each_rank_holds_about_half_of_the_parameters(trained):
    for rank in trained:
        full = rank["zero3"]["full"]
        assert abs(rank["zero3"]["params_held"] - full / 2) <= 0.02 * full
        assert rank["zero2"]["params_held"] == full  # stage 2 keeps every parameter on every rank
