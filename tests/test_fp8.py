"""FP8 training with torchao on CPU processes (docs/fp8.md): losses within 3% of fp32, every parameter trained
(the optimizer made before prepare), exact resume, plain saved weights, DDP / FSDP2 / torch.compile, and the
clear refusals (TransformerEngine, MS-AMP, a recipe without fp8).

torch's CPU ``_scaled_mm`` is slow (about 10 MFLOP/s here), so the models are small: every float8 layer is a
multiple of 16 wide.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

pytest.importorskip("torchao")

from accel_nb import Accelerator  # noqa: E402
from accel_nb.state import AcceleratorState  # noqa: E402
from accel_nb.utils import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs  # noqa: E402
from tests.dist_helpers import run_ranks  # noqa: E402

logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA extensions "Failed to load" on a CPU machine
STEPS = 20


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


def _batches(size: int, rank: int = 0, world: int = 1):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        x, y = torch.randn(size * world, 16, generator=g), torch.randn(size * world, 4, generator=g)
        out.append((x[rank * size : (rank + 1) * size], y[rank * size : (rank + 1) * size]))
    return out


def _step(accelerator, model, optimizer, x, y) -> float:
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def _close(fp8: list[float], fp32: list[float], tol: float = 0.03) -> None:
    worst = max(abs(a - b) / b for a, b in zip(fp8, fp32))
    assert worst < tol, (worst, fp8, fp32)


def _fresh_state() -> None:
    AcceleratorState._reset_state(True)


@pytest.fixture(autouse=True)
def _own_state():
    _fresh_state()
    yield
    _fresh_state()


def _train_mlp(mixed_precision: str, folder: str | None = None, **accelerator_kwargs) -> dict:
    """20 steps of the MLP (optimizer made before prepare); with ``folder``: save at step 10, train on, reload
    and redo steps 11-20 (exact resume), and save_model there."""
    import torch.distributed as dist
    from torchao.float8.float8_linear import Float8Linear

    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    accelerator = Accelerator(mixed_precision=mixed_precision, **accelerator_kwargs)
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model, keep_torch_compile=False)
    kinds = [type(m).__name__ for m in inner if isinstance(m, torch.nn.Linear)]
    batches = _batches(8, rank, world)
    losses = []
    for i, (x, y) in enumerate(batches):
        if folder is not None and i == STEPS // 2:
            accelerator.save_state(folder)
        losses.append(_step(accelerator, model, optimizer, x, y))
    out = {"losses": losses, "kinds": kinds, "backend": str(accelerator.fp8_backend.value)}
    full = {n: p.full_tensor() if hasattr(p, "full_tensor") else p for n, p in inner.named_parameters()}
    out["moved"] = sorted(n for n, p in full.items() if not torch.equal(before[n], p.detach().float()))
    out["names"] = sorted(before)
    local_types = {
        type(getattr(p, "_local_tensor", p)).__name__
        for m in inner
        if isinstance(m, Float8Linear)
        for p in [m.weight]
    }
    out["float8_weight_types"] = sorted(local_types)
    if folder is not None:
        accelerator.load_state(folder)
        out["resumed"] = [_step(accelerator, model, optimizer, x, y) for x, y in batches[STEPS // 2 :]]
        accelerator.save_model(model, f"{folder}/model")
        out["weights"] = {n: t.detach().float().clone() for n, t in full.items()} if rank == 0 else {}
    return out


def _load_plain(folder: str) -> torch.nn.Module:
    from safetensors.torch import load_file

    plain = _mlp()
    state = load_file(f"{folder}/model/model.safetensors")
    assert all(type(t) is torch.Tensor for t in state.values())
    plain.load_state_dict(state, strict=True)
    return plain


# -- one process -------------------------------------------------------------------------------------------
def test_fp8_trains_every_parameter_within_3_percent_resumes_exactly_and_saves_plain_weights(tmp_path):
    fp32 = _train_mlp("no")
    _fresh_state()
    out = _train_mlp("fp8", folder=str(tmp_path))
    _fresh_state()
    # the first and the last linear layer stay in high precision; the two between become float8
    assert out["kinds"] == ["Linear", "Float8Linear", "Float8Linear", "Linear"] and out["backend"] == "AO"
    assert out["moved"] == out["names"]  # every parameter trained (the optimizer was made before prepare)
    _close(out["losses"], fp32["losses"])
    assert out["losses"] != fp32["losses"]  # it really ran in float8
    assert out["resumed"] == out["losses"][STEPS // 2 :]  # exact resume from save_state at step 10
    plain = _load_plain(str(tmp_path))
    for name, value in plain.named_parameters():
        assert torch.equal(value, out["weights"][name]), name


def test_a_tiny_llama_trains_within_3_percent_of_fp32():
    transformers = pytest.importorskip("transformers")
    from tests.tiny_models import tiny_llama_config

    def train(mixed_precision):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(
            tiny_llama_config(hidden_size=32, intermediate_size=64, layers=2)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        accelerator = Accelerator(mixed_precision=mixed_precision)
        model, optimizer = accelerator.prepare(model, optimizer)
        ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
        losses = []
        for _ in range(STEPS):
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        inner = accelerator.unwrap_model(model)
        moved = all(not torch.equal(before[n], p.detach()) for n, p in inner.named_parameters())
        converted = sum(type(m).__name__ == "Float8Linear" for m in inner.modules())
        _fresh_state()
        return losses, moved, converted

    fp32, _, none = train("no")
    fp8, moved, converted = train("fp8")
    # 2 blocks x 7 linear layers and lm_head: all but the first (q_proj of block 0) and the last (lm_head)
    assert none == 0 and converted == 13 and moved
    _close(fp8, fp32)


def test_a_module_filter_func_and_a_reference_recipe_are_honoured():
    import accelerate.utils as reference

    keep_last_two = AORecipeKwargs(module_filter_func=lambda module, name: name in ("4", "6"))
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[keep_last_two])
    model = accelerator.prepare(_mlp())
    assert [type(m).__name__ for m in model][::2] == ["Linear", "Linear", "Float8Linear", "Float8Linear"]
    assert accelerator.ao_recipe_handler is keep_last_two and accelerator.fp8_enabled
    _fresh_state()
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[reference.AORecipeKwargs()])
    assert isinstance(accelerator.ao_recipe_handler, AORecipeKwargs)
    _fresh_state()
    assert Accelerator().fp8_recipe_handler is None and Accelerator().fp8_backend.value == "NO"


def test_fp8_with_torch_compile_matches_eager_fp8():
    from accel_nb.compile import CompileOptions

    eager = _train_mlp("fp8")
    _fresh_state()
    compiled = _train_mlp("fp8", compile=CompileOptions(backend="aot_eager"))
    _fresh_state()
    assert compiled["moved"] == compiled["names"]
    _close(compiled["losses"], eager["losses"], tol=0.01)


def test_transformer_engine_ms_amp_and_bad_recipes_are_refused_before_anything_runs(monkeypatch):
    with pytest.raises(ImportError, match="TransformerEngine.*AORecipeKwargs"):
        TERecipeKwargs()
    with pytest.raises(ImportError, match="MS-AMP, which is not installed"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs()])
    _fresh_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="for torchao pass AORecipeKwargs"):
            FP8RecipeKwargs(backend="ao")
        with pytest.raises(ImportError, match="TransformerEngine"):
            FP8RecipeKwargs(backend="te")
    with pytest.raises(ValueError, match="needs mixed_precision='fp8'.*'bf16'"):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[AORecipeKwargs()])
    _fresh_state()
    with pytest.raises(ValueError, match="two FP8 recipes"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(), MSAMPRecipeKwargs()])
    _fresh_state()
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "MSAMP")  # a launch config's fp8_config: {backend: MSAMP}
    with pytest.raises(ImportError, match="MS-AMP"):
        Accelerator(mixed_precision="fp8")
    _fresh_state()
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    accelerator = Accelerator(mixed_precision="fp8")
    assert accelerator.ao_recipe_handler.config.pad_inner_dim is False
    _fresh_state()


# -- two processes (gloo) ------------------------------------------------------------------------------------
def _ranks(kind: str, folder: str) -> dict:
    from accel_nb.fsdp import FSDPOptions

    kwargs: dict = {"fsdp": FSDPOptions()} if kind.startswith("fsdp") else {}
    if kind.endswith("+compile"):
        from accel_nb.compile import CompileOptions

        kwargs["compile"] = CompileOptions(backend="aot_eager")
    return _train_mlp("fp8", folder=folder, **kwargs)


@pytest.mark.multiproc
@pytest.mark.parametrize("kind", ["ddp+compile", "fsdp", "fsdp+compile"])
def test_two_ranks_train_fp8_like_one_fp32_process_and_resume_exactly(kind, tmp_path):
    fp32 = _train_mlp("no")  # one process with the whole batch
    _fresh_state()
    out = run_ranks(_ranks, world_size=2, args=(kind, str(tmp_path)), timeout=240)
    mean = [(a + b) / 2 for a, b in zip(out[0]["losses"], out[1]["losses"])]
    _close(mean, fp32["losses"])
    for rank in out:
        assert rank["moved"] == rank["names"]
        assert rank["resumed"] == rank["losses"][STEPS // 2 :]
    if kind.startswith(
        "fsdp"
    ):  # the float8 layers' shards all-gather in float8 (torchao's FSDP2 weight wrapper)
        assert out[0]["float8_weight_types"] == ["WeightWithDynamicFloat8CastTensor"]
    else:
        assert out[0]["float8_weight_types"] == ["Parameter"]
    plain = _load_plain(str(tmp_path))
    for name, value in plain.named_parameters():
        assert torch.equal(value, out[0]["weights"][name]), name


# -- the launch config, accel-nb launch, the wizard ---------------------------------------------------------
_SCRIPT = """
import logging
logging.getLogger("torchao").setLevel(logging.ERROR)
import torch
from accel_nb import Accelerator
accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)))
layers = [type(m).__name__ for m in accelerator.unwrap_model(model)]
recipe = accelerator.ao_recipe_handler
print("RESULT", accelerator.mixed_precision, accelerator.fp8_backend.value, recipe.config.pad_inner_dim, layers)
"""


def _cli(*args, cwd):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "accel_nb.commands", "launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_config_files_fp8_config_reaches_the_ranks_and_a_te_backend_is_refused_before_they_start(
    tmp_path, monkeypatch
):
    from accel_nb.config import LaunchConfig
    from accel_nb.precision.fp8_recipes import fp8_launch_env

    # the reference questionnaire's key names are read as its recipes' fields
    env = fp8_launch_env(
        "fp8", {"backend": "ao", "amax_history_length": 16, "override_linear_precision": "1,0,0"}
    )
    assert env["ACCELERATE_FP8_BACKEND"] == env["ACCEL_NB_FP8_BACKEND"] == "AO"
    assert env["ACCELERATE_FP8_AMAX_HISTORY_LEN"] == "16" and env["ACCELERATE_FP8_OVERRIDE_FPROP"] == "1"
    assert fp8_launch_env("bf16", {"backend": "AO"}) == {}
    (tmp_path / "train.py").write_text(_SCRIPT)
    config = tmp_path / "fp8.yaml"
    config.write_text(
        "distributed_type: 'NO'\nnum_processes: 1\nuse_cpu: true\nmixed_precision: fp8\n"
        "fp8_config:\n  backend: AO\n  pad_inner_dim: false\n"
    )
    env = LaunchConfig.load(str(config)).to_env()  # what accel-nb launch gives each rank
    assert env["ACCELERATE_FP8_PAD_INNER_DIM"] == "False" and env["ACCELERATE_MIXED_PRECISION"] == "fp8"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    accelerator = Accelerator()  # as a rank builds it: everything from the environment
    model = accelerator.prepare(torch.nn.Sequential(*(torch.nn.Linear(16, 16) for _ in range(3))))
    assert [type(m).__name__ for m in model] == ["Linear", "Float8Linear", "Linear"]
    assert (
        accelerator.fp8_backend.value == "AO" and accelerator.ao_recipe_handler.config.pad_inner_dim is False
    )
    refused = _cli("--config_file", str(config), "--fp8_backend", "te", "train.py", cwd=tmp_path)
    assert refused.returncode != 0 and "fp8_config backend=TE: its library is not installed" in refused.stderr
    assert "RESULT" not in refused.stdout and "Traceback" not in refused.stderr


def test_the_wizard_and_accel_nb_config_offer_fp8_only_where_torchao_is_installed(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    import accel_nb.availability
    from accel_nb.notebook.wizard import ConfigWizard
    from accel_nb.precision.setting import offered_mixed_precisions

    assert offered_mixed_precisions() == ("no", "fp16", "bf16", "fp8")
    assert "fp8" in ConfigWizard(str(tmp_path / "a.yaml")).controls["mixed_precision"].options
    monkeypatch.setattr(accel_nb.availability, "is_fp8_available", lambda: False)  # a machine without torchao
    assert offered_mixed_precisions() == ("no", "fp16", "bf16")
    assert "fp8" not in ConfigWizard(str(tmp_path / "b.yaml")).controls["mixed_precision"].options
