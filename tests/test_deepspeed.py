"""DeepSpeed ZeRO through Accelerator.prepare on 2 real CPU processes (gloo, DS_ACCELERATOR=cpu).

Each launch runs several configurations one after the other in the same two ranks (importing
DeepSpeed costs seconds), and the test compares what they returned.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before anything imports deepspeed (the ranks are forked)
deepspeed = pytest.importorskip(
    "deepspeed", reason="deepspeed is not installed (pip install 'accel_nb[deepspeed]')"
)

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
        torch.nn.Linear(8, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 1),
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
    return sum(
        t.numel() for s in inner.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0
    )


def _train(plugin_kwargs, mixed_precision=None):
    """Train 2 epochs with accumulation and clipping; the losses, and how much state this rank holds."""
    from accel_nb import Accelerator
    from accel_nb.deepspeed import DeepSpeedPlugin, zero3_init

    _fresh_state()
    plugin = None if plugin_kwargs is None else DeepSpeedPlugin(gradient_clipping=CLIP, **plugin_kwargs)
    accelerator = Accelerator(
        gradient_accumulation_steps=ACCUMULATION, deepspeed_plugin=plugin, mixed_precision=mixed_precision
    )
    with zero3_init(accelerator):  # with zero3_init_flag: built already partitioned
        model = _model()
    materialised = sum(p.numel() for p in model.parameters())  # 0 when partitioned at construction
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
    out = {
        "losses": losses,
        "norms": norms,
        "opt_state": _state_numel(optimizer),
        "full": full,
        "lr": scheduler.get_last_lr()[0],
        "materialised": materialised,
    }
    if plugin is not None:
        out["engine"] = type(model).__name__
        out["distributed_type"] = accelerator.distributed_type.value
        out["params_held"] = sum(getattr(p, "ds_tensor", p).numel() for p in model.module.parameters())
        out["unwrapped"] = type(accelerator.unwrap_model(model)).__name__
        out["dtype"] = str(next(model.module.parameters()).dtype)
    return out


def _all_modes():
    return {
        "ddp": _train(None),
        "zero1": _train({"zero_stage": 1}),
        "zero2": _train({"zero_stage": 2}),
        "zero3": _train({"zero_stage": 3, "zero3_init_flag": False}),
        "zero3_init": _train({"zero_stage": 3, "zero3_init_flag": True}),
        "zero2_offload": _train({"zero_stage": 2, "offload_optimizer_device": "cpu"}),
        "zero2_bf16": _train({"zero_stage": 2}, "bf16"),
        "zero3_bf16": _train({"zero_stage": 3, "zero3_init_flag": False}, "bf16"),
    }


@pytest.fixture(scope="module")
def trained():
    return run_ranks(_all_modes, world_size=2, timeout=900)


def _close(a, b):
    assert len(a) == len(b)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


def test_bf16_on_two_processes_trains_in_bf16_alike_at_stages_2_and_3(trained):
    for rank in trained:
        two, three = rank["zero2_bf16"], rank["zero3_bf16"]
        assert (
            two["dtype"] == three["dtype"] == "torch.bfloat16" and rank["zero2"]["dtype"] == "torch.float32"
        )
        assert two["losses"] == three["losses"]  # the same bf16 computation, partitioned differently
        # bf16 follows the float32 run closely, not exactly
        torch.testing.assert_close(
            torch.tensor(two["losses"]), torch.tensor(rank["ddp"]["losses"]), rtol=0.05, atol=0.02
        )
        assert two["losses"] != rank["zero2"]["losses"]  # it did compute in bf16


@pytest.mark.parametrize("mode", ["zero1", "zero2", "zero3", "zero3_init", "zero2_offload"])
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


# -- save_state / load_state, save_model, and DeepSpeed used by hand ------------------------------------


def _epoch(accelerator, model, optimizer, loader, scheduler=None):
    losses = []
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _prepared(stage, **plugin_kwargs):
    from accel_nb import Accelerator
    from accel_nb.deepspeed import DeepSpeedPlugin

    _fresh_state()
    plugin = DeepSpeedPlugin(zero_stage=stage, gradient_clipping=CLIP, **plugin_kwargs)
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, deepspeed_plugin=plugin)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.8)
    loader = DataLoader(_data(), batch_size=BATCH)
    return (accelerator, *accelerator.prepare(model, optimizer, loader, scheduler))


def _resume_and_save_model(folder, stage):
    """Epoch 1, save_state, epoch 2; then a fresh Accelerator/model: load_state, epoch 2 again. Then save_model."""
    from accel_nb import load_checkpoint_in_model

    accelerator, model, optimizer, loader, scheduler = _prepared(stage, zero3_save_16bit_model=True)
    _epoch(accelerator, model, optimizer, loader, scheduler)
    checkpoint = accelerator.save_state(os.path.join(folder, f"ckpt{stage}"))
    straight = _epoch(accelerator, model, optimizer, loader, scheduler)
    lr_straight = scheduler.get_last_lr()[0]

    accelerator, model, optimizer, loader, scheduler = _prepared(stage, zero3_save_16bit_model=True)
    accelerator.load_state(checkpoint)
    resumed = _epoch(accelerator, model, optimizer, loader, scheduler)
    out = {
        "straight": straight,
        "resumed": resumed,
        "lr": (lr_straight, scheduler.get_last_lr()[0]),
        "files": sorted(os.listdir(checkpoint)),
    }

    target = os.path.join(folder, f"model{stage}")
    accelerator.save_model(model, target)
    state = accelerator.get_state_dict(model)  # gathered on the main process (every rank calls it)
    probe = torch.linspace(-1, 1, 24).reshape(3, 8)
    with torch.no_grad():
        out["engine_out"] = model(probe)  # the engine gathers ZeRO-3 shards for the forward
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        plain = _model()
        # so nothing of the fresh model's weights can pass for the saved ones
        torch.nn.init.zeros_(plain[0].weight)
        load_checkpoint_in_model(plain, target)
        with torch.no_grad():
            out["saved_out"] = plain(probe)
        out["saved_files"] = sorted(os.listdir(target))
        out["same_as_get_state_dict"] = all(torch.equal(state[k], v) for k, v in plain.state_dict().items())
        out["keys"] = sorted(state) == sorted(plain.state_dict())
    return out


def _config(stage):
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": ACCUMULATION,
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},
    }


def _batches():
    rank = torch.distributed.get_rank()
    x, y = _data().tensors
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(rank * BATCH, len(x), 2 * BATCH)]


def _side_by_side(stage):
    """The same config, model, data and seed through accel_nb and through deepspeed.initialize by hand."""
    from accel_nb import Accelerator
    from accel_nb.deepspeed import DeepSpeedPlugin, DummyOptim

    _fresh_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=_config(stage)))
    model = _model()
    model, optimizer = accelerator.prepare(model, DummyOptim(model.parameters(), lr=LR))
    ours = []
    for _ in range(2):
        for x, y in _batches():
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            ours.append(loss.item())

    engine, *_ = deepspeed.initialize(model=_model(), model_parameters=None, config=_config(stage))
    by_hand = []
    for _ in range(2):
        for x, y in _batches():
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            by_hand.append(loss.item())
    return {"ours": ours, "by_hand": by_hand, "accumulation": accelerator.gradient_accumulation_steps}


def _checkpoint_and_by_hand(folder):
    return {
        "resume2": _resume_and_save_model(folder, 2),
        "resume3": _resume_and_save_model(folder, 3),
        "by_hand2": _side_by_side(2),
        "by_hand3": _side_by_side(3),
    }


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("ds"))
    return run_ranks(_checkpoint_and_by_hand, world_size=2, args=(folder,), timeout=900)


@pytest.mark.parametrize("stage", [2, 3])
def test_save_state_then_load_state_resumes_exactly(checkpointed, stage):
    for rank in checkpointed:
        run = rank[f"resume{stage}"]
        assert len(run["resumed"]) == STEPS_PER_EPOCH
        # bit for bit: weights, ZeRO partitions (Adam moments), scheduler
        assert run["resumed"] == run["straight"]
        assert run["lr"][0] == run["lr"][1]
        # the engine's folder in the checkpoint
        assert {"deepspeed_model", "rank_0.pt", "rank_1.pt"} <= set(run["files"])


@pytest.mark.parametrize("stage", [2, 3])
def test_save_model_writes_full_safetensors_weights_read_back_equal(checkpointed, stage):
    main = checkpointed[0][f"resume{stage}"]
    assert main["saved_files"] == ["model.safetensors"]
    assert main["keys"] and main["same_as_get_state_dict"]
    torch.testing.assert_close(main["saved_out"], main["engine_out"], rtol=0, atol=0)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_same_losses_as_deepspeed_initialize_by_hand(checkpointed, stage):
    for rank in checkpointed:
        run = rank[f"by_hand{stage}"]
        assert run["accumulation"] == ACCUMULATION  # taken from the config
        assert len(run["ours"]) == 2 * STEPS_PER_EPOCH
        assert run["ours"] == run["by_hand"]
        # same batches again: the weights moved
        assert run["ours"][:STEPS_PER_EPOCH] != run["ours"][STEPS_PER_EPOCH:]


def test_zero3_init_builds_the_model_partitioned(trained):
    for rank in trained:
        assert rank["zero3"]["materialised"] == rank["ddp"]["materialised"] == rank["ddp"]["full"]
        assert rank["zero3_init"]["materialised"] == 0  # no rank ever held the whole model
        full = rank["zero3_init"]["full"]
        assert abs(rank["zero3_init"]["params_held"] - full / 2) <= 0.02 * full


def test_the_torch_deprecations_deepspeed_triggers_every_step_are_not_shown():
    """ZeRO calls two deprecated torch collectives every step and resets the warning filters every step,
    so each step printed both FutureWarnings on every rank (a flood in the cell); preparing DeepSpeed
    ignores exactly those two messages."""
    import warnings

    import torch.distributed as dist

    from accel_nb.deepspeed.preparing import import_deepspeed

    import_deepspeed("cpu")
    t = torch.zeros(2)
    for _ in range(2):
        with warnings.catch_warnings(
            record=True
        ) as seen:  # entering resets "once per place", as DeepSpeed does
            for collective in (dist.all_gather_into_tensor, dist.reduce_scatter_tensor):
                with pytest.raises(
                    (ValueError, RuntimeError)
                ):  # no process group here: the warning comes first
                    collective(t, t)
            warnings.warn("an unrelated FutureWarning", FutureWarning, stacklevel=1)
        texts = [str(w.message) for w in seen]
        assert texts == ["an unrelated FutureWarning"], texts
