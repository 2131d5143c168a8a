"""FSDP (torch's fully_shard) through Accelerator.prepare on 2 real gloo ranks on CPU: the same weights as
plain one-process training, about half the bytes per rank, sharded/full checkpoints that resume in a new
launch, full weights for a plain model, and clear errors for bad options."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_nb.fsdp import FSDPOptions, FullyShardedDataParallelPlugin, options_from_config
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


# ------------------------------------------------------------------ a small model with repeated blocks


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


def _model() -> torch.nn.Module:
    from accel_nb.utils import set_seed

    set_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), Block(16), Block(16), torch.nn.Linear(16, 1))


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x @ torch.linspace(-1, 1, 6).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=g))


def _train(batch_size, accumulation=1, fsdp=None, epochs=2, optimizer_first=False):
    """The same loop on one plain process or on FSDP ranks; full weights (main process) and byte counts come back.

    ``optimizer_first`` prepares the optimizer in its own, earlier prepare() call.
    """
    from accel_nb import Accelerator
    from accel_nb.fsdp.sharding import local_shard_bytes

    acc = Accelerator(gradient_accumulation_steps=accumulation, fsdp=fsdp)
    model = _model()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    if optimizer_first:
        opt = acc.prepare(opt)
        model, dl = acc.prepare(model, DataLoader(_data(), batch_size=batch_size))
    else:
        model, opt, dl = acc.prepare(model, opt, DataLoader(_data(), batch_size=batch_size))
    norms = []
    for _ in range(epochs):
        for x, y in dl:
            with acc.accumulate(model):
                acc.backward(torch.nn.functional.mse_loss(model(x), y))
                norm = acc.clip_grad_norm_(model.parameters(), 10.0)
                if norm is not None:
                    norms.append(float(norm))
                opt.step()
                opt.zero_grad()
    state = [t for group in opt.state.values() for t in group.values() if torch.is_tensor(t) and t.dim() > 0]
    return {
        "weights": {k: v.detach().cpu().numpy().copy() for k, v in acc.get_state_dict(model).items()},
        "distributed_type": acc.distributed_type.value,
        "is_fsdp2": acc.is_fsdp2,
        "param_bytes": local_shard_bytes(model.parameters()),
        "optimizer_bytes": local_shard_bytes(state),
        "full_bytes": full_bytes,
        "norms": norms,
    }


def _assert_same(weights, reference):
    assert sorted(weights) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------ equivalence and memory


@pytest.mark.multiproc
@pytest.mark.parametrize(
    "options",
    [
        FSDPOptions(),
        FSDPOptions(auto_wrap_classes=["Block"], activation_checkpointing=True, state_dict_type="full"),
        FSDPOptions(sharding_strategy="shard_grad_op", min_num_params=200),
    ],
    ids=["full-root-only", "blocks+activation-checkpointing", "shard_grad_op+size-wrap"],
)
def test_two_fsdp_ranks_match_one_plain_process_with_the_doubled_batch(options):
    reference = _train(batch_size=16)
    out = run_ranks(_train, world_size=2, args=(8, 1, options))
    main = out[0]
    assert main["distributed_type"] == "FSDP" and out[1]["weights"] == {}  # gathered on the main process only
    assert main["is_fsdp2"] and not reference["is_fsdp2"]  # the reference library's flag for FSDP2 runs
    _assert_same(main["weights"], reference["weights"])
    np.testing.assert_allclose(main["norms"], reference["norms"], rtol=1e-5)  # the global norm, every step
    # memory: the ranks split the parameters and the optimizer state (dim 0 of each tensor: nothing held twice),
    # each about half (a [1, 16] weight cannot be split: 51% here)
    assert reference["param_bytes"] == reference["full_bytes"] and reference["optimizer_bytes"] > 0
    for what, total in (
        ("param_bytes", reference["full_bytes"]),
        ("optimizer_bytes", reference["optimizer_bytes"]),
    ):
        assert out[0][what] + out[1][what] == total, what
        assert max(out[0][what], out[1][what]) <= 0.55 * total, what


@pytest.mark.multiproc
def test_fsdp_with_gradient_accumulation_matches_one_process():
    reference = _train(batch_size=8, accumulation=2)
    out = run_ranks(_train, world_size=2, args=(4, 2, FSDPOptions(auto_wrap_classes=["Block"])))
    _assert_same(out[0]["weights"], reference["weights"])
    # under FSDP clip_grad_norm_ acts on sync steps only (None in between); plain training measures both
    np.testing.assert_allclose(out[0]["norms"], reference["norms"][1::2], rtol=1e-5)


@pytest.mark.multiproc
def test_an_optimizer_prepared_before_the_model_follows_the_sharded_parameters():
    reference = _train(batch_size=16, epochs=1)
    out = run_ranks(_train, world_size=2, args=(8, 1, FSDPOptions(auto_wrap_classes=["Block"]), 1, True))
    _assert_same(out[0]["weights"], reference["weights"])
    assert out[1]["optimizer_bytes"] < reference["optimizer_bytes"]  # its state is sharded too


@pytest.mark.multiproc
def test_hybrid_and_no_shard_strategies_train_the_same():
    reference = _train(batch_size=16, epochs=1)
    for strategy, share in (("hybrid", 2), ("no_shard", 1)):
        out = run_ranks(_train, world_size=2, args=(8, 1, FSDPOptions(sharding_strategy=strategy), 1))
        _assert_same(out[0]["weights"], reference["weights"])
        assert out[0]["param_bytes"] + out[1]["param_bytes"] == reference["full_bytes"] * (2 // share), (
            strategy
        )


# ------------------------------------------------------------------ checkpoints


def _resume(folder, mode, phase):
    """Three steps, save_state, three more (phase "save"); or load_state then three steps (phase "load").

    Phase "corrupt": the error load_state raises, and whether the weights stayed as they were.
    """
    from accel_nb import Accelerator

    acc = Accelerator(fsdp=FSDPOptions(auto_wrap_classes=["Block"], state_dict_type=mode))
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model, opt, dl, sched = acc.prepare(model, opt, DataLoader(_data(256), batch_size=8), sched)
    if phase == "corrupt":
        before = {k: v.numpy().copy() for k, v in acc.get_state_dict(model).items()}
        try:
            acc.load_state(os.path.join(folder, "ckpt"))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            after = {k: v.numpy().copy() for k, v in acc.get_state_dict(model).items()}
            return type(exc).__name__, str(exc), all(np.array_equal(before[k], after[k]) for k in before)
        return None
    if phase == "load":
        acc.load_state(os.path.join(folder, "ckpt"))
    batches, losses = iter(dl), []

    def steps(k):
        for _ in range(k):
            x, y = next(batches)
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(acc.reduce(loss.detach(), "mean").item())

    if phase == "save":
        steps(3)
        acc.save_state(os.path.join(folder, "ckpt"))
        acc.save_model(model, os.path.join(folder, "weights"))
        saved = {k: v.numpy().copy() for k, v in acc.get_state_dict(model).items()}
        steps(3)
        return {"losses": losses[3:], "saved": saved}
    steps(3)
    return {"losses": losses}


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["sharded", "full"])
def test_save_state_then_load_state_in_a_new_launch_continues_identically(tmp_path, mode):
    first = run_ranks(_resume, world_size=2, args=(str(tmp_path), mode, "save"))
    # new processes, fresh model
    second = run_ranks(_resume, world_size=2, args=(str(tmp_path), mode, "load"))
    assert second[0]["losses"] == first[0]["losses"] and len(second[0]["losses"]) == 3
    files = set(os.listdir(tmp_path / "ckpt"))
    if mode == "sharded":
        assert {"fsdp_model", "fsdp_optimizer"} <= files and "model.safetensors" not in files
        assert {"__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(tmp_path / "ckpt" / "fsdp_model"))
    else:
        assert {"model.safetensors", "optimizer.bin"} <= files and "fsdp_model" not in files
    # save_model: full weights that a plain model loads
    from safetensors.torch import load_file

    plain = _model()
    plain.load_state_dict(load_file(str(tmp_path / "weights" / "model.safetensors")))
    _assert_same({k: v.numpy() for k, v in plain.state_dict().items()}, first[0]["saved"])


@pytest.mark.multiproc
def test_a_damaged_sharded_checkpoint_changes_nothing(tmp_path):
    run_ranks(_resume, world_size=2, args=(str(tmp_path), "sharded", "save"))
    shard = tmp_path / "ckpt" / "fsdp_model" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-8] + b"x" * 8)  # same size, different bytes
    out = run_ranks(_resume, world_size=2, args=(str(tmp_path), "sharded", "corrupt"))
    name, message, unchanged = out[0]
    assert name == "CheckpointError" and "__1_0.distcp" in message and unchanged


# ------------------------------------------------------------------ bad input


def _bad_inputs(folder):
    from accel_nb import Accelerator, ProjectConfiguration

    acc = Accelerator(fsdp=FSDPOptions(auto_wrap_classes=["GPT2Block"]))
    messages = {}
    for name, make in {
        "missing_class": lambda: acc.prepare(_model()),
        "missing_checkpoint_class": lambda: Accelerator(
            fsdp=FSDPOptions(activation_checkpointing=["Nope"])
        ).prepare(_model()),
        "cpu_offload": lambda: Accelerator(fsdp=FSDPOptions(cpu_offload=True)).prepare(_model()),
    }.items():
        try:
            make()
            messages[name] = None
        except ValueError as exc:
            messages[name] = str(exc)
    # an optimizer that already stepped cannot follow the sharded parameters
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    try:
        Accelerator(fsdp=FSDPOptions()).prepare(model, opt)
        messages["stepped_optimizer"] = None
    except ValueError as exc:
        messages["stepped_optimizer"] = str(exc)
    # save_state refuses what it cannot write: full weights on each node, one optimizer over two models
    node_local = ProjectConfiguration(save_on_each_node=True)
    acc = Accelerator(fsdp=FSDPOptions(state_dict_type="full"), project_config=node_local)
    acc.prepare(_model())
    try:
        acc.save_state(os.path.join(folder, "a"))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        messages["save_on_each_node"] = str(exc)
    acc = Accelerator(fsdp=FSDPOptions())
    first, second = acc.prepare(_model(), _model())
    acc.prepare(torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1))
    try:
        acc.save_state(os.path.join(folder, "b"))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        messages["two_models_one_optimizer"] = str(exc)
    messages["left_behind"] = sorted(os.listdir(folder))
    # not bad input: an optimizer without per-parameter state (SGD without momentum) in full mode
    # (torch's full-state loader once stopped on it: "Expected device to be set")
    acc = Accelerator(fsdp=FSDPOptions(state_dict_type="full"))
    model = _model()
    model, sgd = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(2, 6)).sum().backward()
    sgd.step()
    acc.save_state(os.path.join(folder, "stateless"))
    sgd.param_groups[0]["lr"] = 5.0
    acc.load_state(os.path.join(folder, "stateless"))
    messages["stateless_lr"] = sgd.param_groups[0]["lr"]
    return messages


@pytest.mark.multiproc
def test_bad_options_on_two_ranks_are_clear_errors_naming_the_option(tmp_path):
    messages = run_ranks(_bad_inputs, world_size=2, args=(str(tmp_path),))[0]
    assert "auto_wrap_classes: 'GPT2Block' is not a class in this Sequential" in messages["missing_class"]
    assert "Block, Linear, Sequential" in messages["missing_class"]  # what the model has
    assert "activation_checkpointing: 'Nope'" in messages["missing_checkpoint_class"]
    assert "FSDPOptions(cpu_offload=True) needs a GPU run" in messages["cpu_offload"]
    assert (
        "already has state" in messages["stepped_optimizer"] and "load_state" in messages["stepped_optimizer"]
    )
    assert (
        "save_on_each_node=True with FSDPOptions(state_dict_type='full') is not supported"
        in messages["save_on_each_node"]
    )
    assert "several FSDP-sharded models" in messages["two_models_one_optimizer"]
    assert messages["left_behind"] == []  # no half-written checkpoint
    assert messages["stateless_lr"] == 0.1


def test_fsdp_with_one_process_is_a_clear_error():
    from accel_nb import Accelerator

    with pytest.raises(ValueError, match="fsdp= shards the model over several processes but this run has 1"):
        Accelerator(fsdp=FSDPOptions())
    with pytest.raises(ValueError, match="either fsdp=FSDPOptions"):
        Accelerator(fsdp=FSDPOptions(), fsdp_plugin=FullyShardedDataParallelPlugin())


def test_options_check_their_values():
    assert FSDPOptions(sharding_strategy="HYBRID_SHARD").sharding_strategy == "hybrid"
    assert not FSDPOptions(sharding_strategy="SHARD_GRAD_OP").reshards_after_forward
    assert FSDPOptions(auto_wrap_classes=[Block], activation_checkpointing=True).checkpointed_classes == [
        "Block"
    ]
    for kwargs, fragment in [
        ({"sharding_strategy": "zero3"}, "sharding_strategy='zero3' is not a sharding strategy"),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, "state_dict_type='LOCAL_STATE_DICT' is not supported"),
        ({"min_num_params": 0}, "min_num_params=0 must be"),
        (
            {"activation_checkpointing": True},
            "activation_checkpointing=True checkpoints the auto_wrap_classes",
        ),
        ({"cpu_offload": "yes"}, "cpu_offload='yes' must be True or False"),
    ]:
        with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
            FSDPOptions(**kwargs)


def test_the_reference_plugin_and_config_keys_map_to_fsdp2_options():
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        reshard_after_forward=False,
        state_dict_type="FULL_STATE_DICT",
        activation_checkpointing=True,
    )
    assert plugin.to_options() == FSDPOptions(
        auto_wrap_classes=["Block"],
        reshard_after_forward=False,
        state_dict_type="full",
        activation_checkpointing=True,
    )
    with pytest.warns(UserWarning, match="fsdp_version=1: accel_nb runs FSDP2"):
        options = options_from_config(
            {
                "fsdp_version": 1,
                "fsdp_sharding_strategy": "HYBRID_SHARD",
                "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
                "fsdp_min_num_params": 1000,
                "fsdp_offload_params": "false",
                "fsdp_use_orig_params": True,
            }
        )
    assert options == FSDPOptions(sharding_strategy="hybrid", min_num_params=1000)
    for bad, fragment in [
        (
            FullyShardedDataParallelPlugin(ignored_modules=[torch.nn.Linear(1, 1)]),
            "ignored_modules=...) is not supported",
        ),
        (
            FullyShardedDataParallelPlugin(mixed_precision_policy="bf16"),
            "the Accelerator's mixed_precision sets it",
        ),
        (FullyShardedDataParallelPlugin(auto_wrap_policy=lambda m: True), "auto_wrap_policy=<callable>"),
        (
            FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap"),
            "needs transformer_cls_names",
        ),
        (
            FullyShardedDataParallelPlugin(activation_checkpointing=True),
            "needs transformer_cls_names_to_wrap",
        ),
    ]:
        with pytest.raises(
            ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")
        ):
            bad.to_options()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FullyShardedDataParallelPlugin(backward_prefetch="BACKWARD_PRE").to_options()
    assert any("applies to FSDP1 only" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="fsdp_config.fsdp_typo is not a key"):
        options_from_config({"fsdp_typo": 1})


def test_the_names_are_importable_where_the_reference_has_them():
    import accel_nb
    from accel_nb import utils

    assert accel_nb.FSDPOptions is FSDPOptions and utils.FSDPOptions is FSDPOptions
    assert utils.FullyShardedDataParallelPlugin is FullyShardedDataParallelPlugin


# ------------------------------------------------------------------ the faces: notebook_launcher, accel-nb launch


def _example_train(options):
    from examples.fsdp_finetune import train

    return train(options, epochs=1)


@pytest.mark.multiproc
def test_notebook_launcher_runs_fsdp():
    from accel_nb import notebook_launcher
    from accel_nb.launch.parent.reporting import ListReporter

    out = notebook_launcher(
        _example_train,
        args=(FSDPOptions(auto_wrap_classes=["Block"]),),
        num_processes=2,
        cpu=True,
        reporter=ListReporter(),
    )
    assert [o["distributed_type"] for o in out] == ["FSDP", "FSDP"]
    assert (
        out[0]["param_share"] == pytest.approx(0.5, abs=0.01) and out[0]["last_loss"] < out[0]["first_loss"]
    )


@pytest.mark.multiproc
def test_accel_nb_launch_with_an_fsdp_config_file(tmp_path):
    import json
    import subprocess
    import sys

    from safetensors.torch import load_file

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = tmp_path / "fsdp.yaml"
    cfg.write_text(
        "distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n  fsdp_version: 2\n"
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Block\n"
        "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_activation_checkpointing: true\n"
    )
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root, ACCEL_NB_CONFIG_FILE=str(tmp_path / "none.yaml")
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "accel_nb.commands",
            "launch",
            "--config_file",
            str(cfg),
            "examples/fsdp_finetune.py",
            "--out",
            str(tmp_path / "run"),
            "--epochs",
            "1",
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["distributed_type"] == "FSDP" and summary["param_share"] == pytest.approx(0.5, abs=0.01)
    assert {"fsdp_model", "fsdp_optimizer"} <= set(os.listdir(tmp_path / "run" / "checkpoint"))
    sys.path.insert(0, root)
    try:
        from examples.fsdp_finetune import TinyGPT
    finally:
        sys.path.remove(root)
    TinyGPT().load_state_dict(load_file(str(tmp_path / "run" / "weights" / "model.safetensors")))


# ------------------------------------------------------------------ mixed precision from the Accelerator


def _mixed(precision):
    """Three steps in ``precision``: the dtype the blocks compute in, the dtype of the kept shards, the losses."""
    from accel_nb import Accelerator

    acc = Accelerator(mixed_precision=precision, fsdp=FSDPOptions(auto_wrap_classes=["Block"]))
    model = _model()
    seen = []
    model[1].lin.register_forward_hook(lambda module, args, out: seen.append(module.weight.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt, dl = acc.prepare(model, opt, DataLoader(_data(), batch_size=8))
    losses = []
    for x, y in dl:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {
        "compute": {str(d) for d in seen},
        "kept": {str(p.dtype) for p in model.parameters()},
        "output": str(model(x).dtype),
        "losses": losses,
        "scaler": acc.scaler is not None,
    }


@pytest.mark.multiproc
@pytest.mark.parametrize("precision, dtype", [("bf16", "torch.bfloat16"), ("fp16", "torch.float16")])
def test_mixed_precision_follows_the_accelerator(precision, dtype):
    out = run_ranks(_mixed, world_size=2, args=(precision,))[0]
    assert out["compute"] == {dtype}  # the gathered parameters, cast for compute (MixedPrecisionPolicy)
    assert out["kept"] == {"torch.float32"}  # the sharded master weights stay fp32
    assert out["output"] == "torch.float32"  # outputs back in fp32, as without FSDP
    assert out["scaler"] == (precision == "fp16")
    assert all(np.isfinite(out["losses"])) and out["losses"][-1] < out["losses"][0]
