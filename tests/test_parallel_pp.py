"""Pipeline parallel (torch.distributed.pipelining) on real gloo ranks on CPU: prepare_pippy on 2 and 4 ranks
gives the whole model's logits (a tiny Llama), PipelineTrainer's GPipe and 1F1B losses equal unsplit training's
and a saved stage state resumes exactly; bad split points, missing example inputs and an optimizer built before
the split are refused before anything runs."""

from __future__ import annotations

import pytest
import torch

from accel_nb.big_model import compute_module_sizes
from accel_nb.parallel.pipeline_split import check_split_points, plan_split_points, stage_bytes
from tests.test_fsdp import Block  # a residual linear block

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


# ------------------------------------------------------------------ models and data


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), Block(16), Block(16), Block(16), torch.nn.Linear(16, 1)
    )


def _batches(n: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)) for _ in range(n)]


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        use_cache=False,
    )
    return LlamaForCausalLM(config).eval()


def _tokens(batch: int, length: int) -> torch.Tensor:
    return torch.randint(
        0, 64, (batch, length), generator=torch.Generator().manual_seed(batch * 100 + length)
    )


def _plain_training(batches, max_grad_norm=None) -> tuple[list[float], torch.nn.Module]:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    out = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out, model


def _plain_losses(batches) -> list[float]:
    return _plain_training(batches)[0]


def _next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )


def _token_batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 64, (8, 12), generator=g) for _ in range(5)]


def _plain_llama_losses() -> list[float]:
    model = _llama().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for tokens in _token_batches():
        loss = _next_token_loss(model(tokens).logits, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


class _WithUnusedModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _trainer(schedule: str, n_microbatches: int = 4, max_grad_norm=None):
    from accel_nb import PipelineTrainer

    return PipelineTrainer(
        _mlp(),
        torch.nn.functional.mse_loss,
        lambda params: torch.optim.AdamW(params, lr=0.01),
        example_args=(_batches(1)[0][0],),
        n_microbatches=n_microbatches,
        schedule=schedule,
        max_grad_norm=max_grad_norm,
    )


# ------------------------------------------------------------------ what each rank runs


def _two_ranks(folder: str) -> dict:
    """prepare_pippy on a tiny Llama (auto and named split points), then GPipe and 1F1B training with resume."""
    from accel_nb import PipelineTrainer, prepare_pippy

    model, x, x_3x5 = _llama(), _tokens(4, 8), _tokens(3, 5)
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # a left-padded row
    inputs = {"input_ids": x, "attention_mask": mask, "use_cache": False}
    with torch.no_grad():
        out = {
            "whole": model(x).logits,
            "whole_3x5": model(x_3x5).logits,
            "whole_masked": model(**inputs).logits,
        }
    piped = prepare_pippy(model, split_points="auto", example_args=(x,), num_chunks=2)
    out["split_points"] = piped.hf_split_points
    out["logits"] = piped(x)  # the last rank's; None elsewhere
    out["logits_3x5"] = piped(x_3x5)  # padded to 4 rows and traced again for the new shape
    # named split points, keyword inputs (a non-tensor one too), the output on every rank
    gathered = prepare_pippy(
        _llama(), split_points=["model.layers.1"], example_kwargs=inputs, gather_output=True
    )
    out["gathered"] = gathered(**inputs)
    out["reference"] = _reference_pippy(x)
    for schedule in ("gpipe", "1f1b"):
        batches = _batches()
        trainer = _trainer(schedule)
        first = [trainer.step(xb, target=yb) for xb, yb in batches[:3]]
        trainer.save_state(f"{folder}/{schedule}")
        rest = [trainer.step(xb, target=yb) for xb, yb in batches[3:]]
        resumed = _trainer(schedule)
        resumed.load_state(f"{folder}/{schedule}")
        out[schedule] = {
            "losses": first + rest,
            "resumed": [resumed.step(xb, target=yb) for xb, yb in batches[3:]],
            "stage_params": sorted(resumed.model.state_dict()),
        }
    llama = PipelineTrainer(  # a transformers model, next-token loss, 1F1B
        _llama().train(),
        _next_token_loss,
        lambda params: torch.optim.AdamW(params, lr=1e-3),
        example_args=(_token_batches()[0],),
        n_microbatches=4,
        schedule="1f1b",
    )
    out["llama_losses"] = [llama.step(tokens, target=tokens) for tokens in _token_batches()]
    try:  # a split point the forward never calls: refused on every rank before anything runs
        prepare_pippy(_WithUnusedModule(), split_points=["unused"], example_args=(torch.zeros(2, 4),))
    except ValueError as exc:
        out["unused_split"] = str(exc)
    clipped = _trainer("gpipe", max_grad_norm=0.05)  # small enough to clip every step
    out["clipped"] = [clipped.step(xb, target=yb) for xb, yb in _batches()]
    out["clipped_weights"] = clipped.full_state_dict()
    try:  # another batch shape: refused on every rank (process 0 tells the others), nothing left hanging
        trainer.step(torch.zeros(4, 6), target=torch.zeros(4, 1))
    except ValueError as exc:
        out["wrong_shape"] = str(exc)
    return out


def _reference_pippy(x: torch.Tensor):
    """The reference library's prepare_pippy on the same model and batch (docs/pipeline.md: its differences)."""
    try:
        from accelerate import PartialState as ReferenceState
        from accelerate.inference import prepare_pippy as reference_prepare_pippy
    except ImportError:
        return "not installed"
    ReferenceState(cpu=True)  # without cpu=True it sees one process on a machine without CUDA
    # its example_args are one microbatch (our group, set up by accel_nb, is adopted)
    model = reference_prepare_pippy(_llama(), example_args=(x[:2],), num_chunks=2)
    with torch.no_grad():
        return model(x)


def _four_ranks(folder: str) -> dict:
    """prepare_pippy with 4 stages (output gathered to every rank), and 1F1B training through 4 stages."""
    from accel_nb import prepare_pippy

    model, x = _llama(), _tokens(4, 8)
    with torch.no_grad():
        out = {"whole": model(x).logits}
    piped = prepare_pippy(model, example_args=(x,), gather_output=True)
    out["split_points"] = piped.hf_split_points
    out["gathered"] = piped(x)
    trainer = _trainer("1f1b", n_microbatches=4)
    out["1f1b"] = [trainer.step(xb, target=yb) for xb, yb in _batches()]
    from accel_nb import PipelineTrainer

    try:  # Llama's rotary embeddings feed every block: a skip connection torch cannot train through
        PipelineTrainer(
            _llama().train(),
            _next_token_loss,
            lambda params: torch.optim.AdamW(params, lr=1e-3),
            example_args=(_token_batches()[0],),
            n_microbatches=4,
        )
    except ValueError as exc:  # refused on every rank before anything is sent
        out["skip"] = str(exc)
    return out


def _launch(n: int, folder: str, reporter=None) -> list[dict]:
    import transformers  # noqa: F401 - imported once here, so the forked ranks inherit it

    from accel_nb import notebook_launcher
    from accel_nb.launch.parent.reporting import ListReporter

    ranks = _two_ranks if n == 2 else _four_ranks
    reporter = reporter or ListReporter()
    return notebook_launcher(ranks, args=(folder,), num_processes=n, cpu=True, reporter=reporter)


def _check_inference(results: list[dict]) -> None:
    last = results[-1]
    if len(results) == 2:
        torch.testing.assert_close(last["logits"], last["whole"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(last["logits_3x5"], last["whole_3x5"], rtol=1e-5, atol=1e-5)
        assert results[0]["logits"] is None and results[0]["logits_3x5"] is None
    expected = last["whole_masked"] if len(results) == 2 else last["whole"]
    for r in results:  # gather_output=True: every rank holds the output
        torch.testing.assert_close(r["gathered"], expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ multi-process


@pytest.mark.multiproc
def test_two_stage_inference_and_training_match_the_whole_model(tmp_path):
    results = _launch(2, str(tmp_path))
    _check_inference(results)
    assert results[0]["split_points"] == ["model.layers.2"]  # balanced: equal halves of the layers
    if results[-1]["reference"] != "not installed":  # side by side: the same logits as the reference's
        assert results[0]["reference"] is None
        torch.testing.assert_close(results[-1]["reference"], results[-1]["logits"], rtol=1e-5, atol=1e-5)
    plain = _plain_losses(_batches())
    for schedule in ("gpipe", "1f1b"):
        runs = [r[schedule] for r in results]
        for run in runs:  # every rank reports the batch loss
            assert run["losses"] == pytest.approx(plain, rel=1e-5, abs=1e-6)
            assert run["resumed"] == run["losses"][3:]  # exactly: same weights, same optimizer state
        # each stage holds only its own parameters: together, the whole model's, once
        assert runs[0]["stage_params"] == ["0.bias", "0.weight", "1.lin.bias", "1.lin.weight"]
        assert sorted(runs[0]["stage_params"] + runs[1]["stage_params"]) == sorted(_mlp().state_dict())
    assert all("differ in shape from example_args" in r["wrong_shape"] for r in results)
    assert all("is not called by the model's forward" in r["unused_split"] for r in results)
    llama_losses = _plain_llama_losses()
    for r in results:
        assert r["llama_losses"] == pytest.approx(llama_losses, rel=1e-5)
    # gradient clipping over both stages = clip_grad_norm_ on the whole model; full weights on process 0
    clipped_losses, clipped_model = _plain_training(_batches(), max_grad_norm=0.05)
    assert clipped_losses != pytest.approx(plain, rel=1e-3)  # the clipping did change the run
    assert results[0]["clipped"] == pytest.approx(clipped_losses, rel=1e-5, abs=1e-6)
    assert results[1]["clipped_weights"] == {}
    full = results[0]["clipped_weights"]
    assert sorted(full) == sorted(clipped_model.state_dict())
    for name, value in clipped_model.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    assert {p.name for p in tmp_path.glob("gpipe/*")} == {
        "pipeline_stage_0_of_2.pt",
        "pipeline_stage_1_of_2.pt",
    }


@pytest.mark.multiproc
def test_four_stage_inference_and_1f1b_training_match_the_whole_model(tmp_path):
    from accel_nb.events import Role
    from accel_nb.launch.parent.reporting import ListReporter

    reporter = ListReporter()
    results = _launch(4, str(tmp_path), reporter)
    _check_inference(results)
    assert results[0]["split_points"] == ["model.layers.1", "model.layers.2", "model.layers.3"]
    # each rank told the launch its stage (the rows show "rank 2 [pp 2/4 · layers 2]"): prepare_pippy's first
    first = {}
    for event in reporter.of_type(Role):
        first.setdefault(event.rank, event)
    assert [first[r].text() for r in range(4)] == [f"pp {r}/4 · layers {r}" for r in range(4)]
    plain = _plain_losses(_batches())
    for r in results:
        assert r["1f1b"] == pytest.approx(plain, rel=1e-5, abs=1e-6)
        assert "stage 0 sends one floating-point value to stages 1, 2, 3" in r.get("skip", ""), r.get("skip")
        assert "Train with 2 stages" in r["skip"]


# ------------------------------------------------------------------ one process: planning and refusals


def test_auto_split_points_balance_parameter_bytes():
    model = _llama()
    assert plan_split_points(model, 2) == ["model.layers.2"]
    three = plan_split_points(model, 3)
    sizes = stage_bytes(model, three)
    assert sum(sizes) == compute_module_sizes(model)[""]  # parameters and buffers, each once
    # no other pair of cuts in front of decoder layers makes a smaller largest stage
    layers = [f"model.layers.{i}" for i in range(4)]
    best = min(max(stage_bytes(model, [a, b])) for i, a in enumerate(layers) for b in layers[i + 1 :])
    assert max(sizes) == best
    assert plan_split_points(_mlp(), 5) == ["1", "2", "3", "4"]  # no block classes: the model's children


def test_bad_split_points_are_refused_with_the_fix():
    model = _llama()
    with pytest.raises(
        ValueError, match=r"'model\.layer\.2' is not a module.*Did you mean 'model\.layers\.2'"
    ):
        check_split_points(model, ["model.layer.2"], 2)
    with pytest.raises(ValueError, match=r"2 split points make 3 stages, but the pipeline has 2"):
        check_split_points(model, ["model.layers.1", "model.layers.2"], 2)
    with pytest.raises(
        ValueError, match="cannot split this LlamaForCausalLM into 6 pipeline stages.*at most 5"
    ):
        plan_split_points(model, 6)


def test_prepare_pippy_refuses_missing_example_inputs_and_runs_whole_on_one_process():
    from accel_nb import prepare_pippy

    with pytest.raises(ValueError, match="needs example inputs.*example_args=\\(batch,\\)"):
        prepare_pippy(_llama())
    with pytest.raises(ValueError, match="is not a module"):
        prepare_pippy(_llama(), split_points=["lm_heads"], example_args=(_tokens(2, 4),))
    model = _llama()
    x = _tokens(2, 4)
    with torch.no_grad():
        whole = model(x).logits
        torch.testing.assert_close(prepare_pippy(model, example_args=(x,)).forward(x).logits, whole)
        # prepared again (a cell run twice): built on the model's own forward, not on the previous pipeline
        again = prepare_pippy(model, example_args=(x,))
        assert again.pipeline.original_forward.__func__ is type(model).forward
        torch.testing.assert_close(again(x).logits, whole)


def test_pipeline_trainer_refuses_what_cannot_be_staged():
    from accel_nb import PipelineTrainer

    model = _mlp()
    x = _batches(1)[0][0]
    mse = torch.nn.functional.mse_loss
    with pytest.raises(
        TypeError, match="built over the model's parameters before the split: it cannot be staged"
    ):
        PipelineTrainer(model, mse, torch.optim.SGD(model.parameters(), lr=0.1), example_args=(x,))
    with pytest.raises(ValueError, match="holds 2 parameters of other stages"):
        PipelineTrainer(
            model,
            mse,
            lambda params: torch.optim.SGD([*params, *_mlp()[0].parameters()], lr=0.1),
            example_args=(x,),
        )
    with pytest.raises(ValueError, match="does not split into 3 equal microbatches"):
        PipelineTrainer(model, mse, lambda p: torch.optim.SGD(p, lr=0.1), example_args=(x,), n_microbatches=3)
    with pytest.raises(ValueError, match="schedule must be one of"):
        PipelineTrainer(model, mse, lambda p: torch.optim.SGD(p, lr=0.1), example_args=(x,), schedule="zb")
    with pytest.raises(ValueError, match="needs example inputs"):
        PipelineTrainer(model, mse, lambda p: torch.optim.SGD(p, lr=0.1))


def test_one_process_pipeline_trainer_is_plain_microbatched_training(tmp_path):
    batches = _batches()
    trainer = _trainer("gpipe")
    losses = [trainer.step(x, target=y) for x, y in batches]
    assert losses == pytest.approx(_plain_losses(batches), rel=1e-5, abs=1e-6)
    clipped = _trainer("gpipe", max_grad_norm=0.05)
    assert [clipped.step(x, target=y) for x, y in batches] == pytest.approx(
        _plain_training(batches, max_grad_norm=0.05)[0], rel=1e-5, abs=1e-6
    )
    trainer.save_state(str(tmp_path))
    other = _trainer("gpipe")
    other.load_state(str(tmp_path))
    assert other.steps == len(batches)
    with pytest.raises(FileNotFoundError, match="no pipeline stage file pipeline_stage_0_of_1.pt"):
        other.load_state(str(tmp_path / "missing"))
    blob = trainer.state_dict()
    with pytest.raises(ValueError, match=r"holds 2 stages split at \['2'\].*resume with the same number"):
        other.load_state_dict({**blob, "num_stages": 2, "split_points": ["2"]})
