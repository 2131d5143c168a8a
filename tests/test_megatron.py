"""Megatron-LM through megatron-core on real gloo ranks on CPU (issue 43), with the test-only CUDA stand-ins of
tests/megatron_standins.py installed in each rank (never in accel_nb): TP=2, PP=2 and DP=2 give the losses and
weights of one process over several steps, a Llama built from a small config splits its SwiGLU and grouped
attention exactly, the reference's BERT (binary head on and off) and T5 kinds give one process's losses with TP=2, save_state/load_state resume exactly in a new launch, and the refusals name their cause."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("megatron.core")
# imported once here, so the forked ranks of every launch start with them (seconds per launch on 2 cores);
# megatron-core warns at import that Apex and Transformer Engine are absent (they are GPU libraries)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.bert.bert_model  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.models.T5.t5_model  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401
    import transformers

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state

VOCAB, SEQ = 100, 16


def _hf_model(kind: str):
    if kind.startswith(
        "bert"
    ):  # the reference's BERT kind: a Megatron-BERT masked LM (binary head: num_labels 2)
        cfg = transformers.MegatronBertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=SEQ,
            num_labels=1 if kind == "bert-no-head" else 2,
        )
        return transformers.MegatronBertForMaskedLM(cfg)
    if kind == "t5":
        cfg = transformers.T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, n_positions=SEQ
        )
        return transformers.T5ForConditionalGeneration(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ, eos_token_id=0
        )
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg)


def _data(n: int = 64, kind: str = "gpt2") -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(0, VOCAB, (SEQ,), generator=g)} for _ in range(n)]
    for sample in samples:
        ids = sample["input_ids"]
        if kind.startswith("bert"):  # a quarter of the positions predicted, padding at the end, two segments
            labels = torch.where(torch.rand(SEQ, generator=g) < 0.25, ids, -100)
            sample["attention_mask"] = (
                torch.arange(SEQ) < SEQ - int(torch.randint(0, 4, (), generator=g))
            ).long()
            sample["token_type_ids"] = (torch.arange(SEQ) >= SEQ // 2).long()
            sample["labels"] = labels
            sample["next_sentence_label"] = torch.randint(0, 2, (), generator=g)
        elif kind == "t5":  # 12 target tokens, the last two not counted
            sample["attention_mask"] = (torch.arange(SEQ) < SEQ - 3).long()
            sample["labels"] = torch.where(
                torch.arange(12) < 10, torch.randint(0, VOCAB, (12,), generator=g), -100
            )
    return samples


def _start_weights(names_shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The same start in every layout: norms near 1, the rest small (keyed by the one-process names)."""
    g = torch.Generator().manual_seed(5)
    out = {}
    for name in sorted(names_shapes):
        noise = torch.randn(names_shapes[name], generator=g) * 0.2
        out[name] = noise + (1.0 if "norm" in name and name.endswith("weight") else 0.0)
    return out


def _prepare(
    kind,
    tp,
    pp,
    micro_batches,
    batch_size,
    scheduler=False,
    lr=1e-2,
    precision=None,
    clipping=0.0,
    start=True,
):
    from accel_nb import Accelerator
    from accel_nb.megatron import MegatronLMDummyScheduler, MegatronLMPlugin

    if not torch.cuda.is_available():
        from tests import megatron_standins

        megatron_standins.install()  # test-only: megatron-core's CUDA calls on CPU, and the GPU check off
    plugin = MegatronLMPlugin(
        tp_degree=tp, pp_degree=pp, num_micro_batches=micro_batches, gradient_clipping=clipping
    )
    acc = Accelerator(mixed_precision=precision, megatron_lm_plugin=plugin)

    model = _hf_model(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    loader = torch.utils.data.DataLoader(_data(kind=kind), batch_size=batch_size)
    objects = [model, opt, loader]
    if scheduler:
        objects.append(MegatronLMDummyScheduler(opt, total_num_steps=20, warmup_num_steps=2))
    prepared = acc.prepare(*objects)
    engine = prepared[0]
    if start:
        full = engine.full_weights()
        engine.load_full_weights(_start_weights({k: tuple(v.shape) for k, v in full.items()}))
    return acc, prepared


def _fresh_round_trip(kind):
    """A fresh model's eval loss, then again after loading its own full weights (vocabulary 100: padded)."""
    acc, (engine, _, loader) = _prepare(kind, 1, 1, 1, 4, start=False)
    engine.eval()
    batch = next(iter(loader))
    before = float(engine(**batch))
    engine.load_full_weights(engine.full_weights())
    return before, float(engine(**batch))


def _train(kind, tp, pp, micro_batches, batch_size, steps=4):
    acc, (engine, opt, loader) = _prepare(kind, tp, pp, micro_batches, batch_size)
    engine.train()
    losses = []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        loss = engine(**batch)
        acc.backward(loss)  # nothing: the forward stepped (the reference's meaning)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    engine.eval()
    batch = next(iter(loader))
    eval_loss = float(engine(**batch))
    weights = {k: v.numpy() for k, v in engine.full_weights().items()}
    # the reference's Megatron helpers and gather_for_metrics: over the data-parallel ranks only
    from megatron.core import parallel_state as ps

    from accel_nb.megatron.helpers import (
        avg_losses_across_data_parallel_group,
        gather_across_data_parallel_groups,
    )

    dp_rank = torch.tensor(float(ps.get_data_parallel_rank()))
    return {
        "losses": losses,
        "eval": eval_loss,
        "weights": weights,
        "distributed_type": acc.distributed_type.value,
        "backend": acc.backend.name,
        "gathered": (
            acc.gather_for_metrics(batch["input_ids"]).shape[0],
            gather_across_data_parallel_groups({"ids": batch["input_ids"]})["ids"].shape[0],
        ),
        "mean_dp_rank": float(avg_losses_across_data_parallel_group([dp_rank])[0]),
    }


def _train_many(runs):
    return [_train(*run) for run in runs]


def _launch(fn, args, n, cpu=True):
    from accel_nb import notebook_launcher
    from accel_nb.launch.parent.reporting import ListReporter

    return notebook_launcher(fn, args=args, num_processes=n, cpu=cpu, reporter=ListReporter())


def _comparable(name, value):
    """The key rows of GPT-2's qkv bias are left out: a bias added to every key shifts each query's scores by a
    constant, which softmax ignores, so its gradient is 0 up to rounding and Adam turns that rounding into
    lr-sized steps that differ between layouts. (Megatron's layout: per head [query, key, value] rows; T5's
    cross-attention: per head [key, value] rows, the same for its key rows.)"""
    head = 32 // 4
    if name.endswith("linear_qkv.bias"):
        rows = np.arange(value.shape[0]) % (3 * head)
        return value[(rows < head) | (rows >= 2 * head)]
    if name.endswith("linear_kv.bias"):
        return value[np.arange(value.shape[0]) % (2 * head) >= head]
    return value


def _assert_same(run, reference, what):
    np.testing.assert_allclose(run["losses"], reference["losses"], rtol=2e-5, err_msg=f"{what}: losses")
    assert run["eval"] == pytest.approx(reference["eval"], rel=2e-5), what
    assert sorted(run["weights"]) == sorted(reference["weights"]), what
    for name, value in reference["weights"].items():
        np.testing.assert_allclose(
            _comparable(name, run["weights"][name]),
            _comparable(name, value),
            rtol=1e-4,
            atol=2e-6,
            err_msg=f"{what}: {name}",
        )


@pytest.fixture(scope="module")
def one_process():
    """The one-process runs every layout is compared with: GPT-2 (batches of 8) and Llama (batches of 8)."""
    gpt, llama = _launch(_train_many, ([("gpt2", 1, 1, 1, 8), ("llama", 1, 1, 1, 8)],), 1)[0]
    return {"gpt2": gpt, "llama": llama}


@pytest.mark.multiproc
def test_tensor_parallel_gpt2_and_llama_match_one_process(one_process):
    out = _launch(_train_many, ([("gpt2", 2, 1, 1, 8), ("llama", 2, 1, 1, 8)],), 2)
    for rank in out:
        _assert_same(rank[0], one_process["gpt2"], "gpt2 tp=2")
        _assert_same(rank[1], one_process["llama"], "llama tp=2 (SwiGLU and grouped query attention split)")
        assert rank[0]["distributed_type"] == "MEGATRON_LM" and rank[0]["backend"] == "megatron"
        # one data-parallel rank holding 8 samples: gathered once, not once per tensor-parallel rank
        assert rank[0]["gathered"] == (8, 8) and rank[0]["mean_dp_rank"] == 0.0
    losses = one_process["gpt2"]["losses"]
    assert losses[-1] < losses[0] - 0.05, losses  # it trains


@pytest.mark.multiproc
def test_pipeline_parallel_with_micro_batches_matches_one_process(one_process):
    # two stages of one layer each, 2 micro-batches of 4 per step: the same 8 samples a step
    out = _launch(_train_many, ([("gpt2", 1, 2, 2, 4)],), 2)
    for rank in out:
        _assert_same(rank[0], one_process["gpt2"], "gpt2 pp=2")


@pytest.mark.multiproc
def test_data_parallel_matches_one_process(one_process):
    out = _launch(_train_many, ([("gpt2", 1, 1, 1, 4)],), 2)  # 2 ranks x 4 samples
    for rank in out:
        _assert_same(rank[0], one_process["gpt2"], "gpt2 dp=2")
        assert rank[0]["gathered"] == (8, 8) and rank[0]["mean_dp_rank"] == 0.5  # both ranks' samples


@pytest.mark.multiproc
def test_tensor_and_pipeline_parallel_on_four_processes(one_process):
    out = _launch(_train_many, ([("llama", 2, 2, 2, 4)],), 4)
    for rank in out:
        _assert_same(rank[0], one_process["llama"], "llama tp=2 x pp=2")


@pytest.fixture(scope="module")
def encoders_one_process():
    """The one-process runs of the reference's other kinds: BERT with and without its binary head, and T5."""
    runs = [("bert", 1, 1, 1, 8), ("bert-no-head", 1, 1, 1, 8), ("t5", 1, 1, 1, 8)]
    return dict(zip(("bert", "bert-no-head", "t5"), _launch(_train_many, (runs,), 1)[0]))


@pytest.mark.multiproc
def test_tensor_parallel_bert_and_t5_match_one_process(encoders_one_process):
    runs = [("bert", 2, 1, 1, 8), ("bert-no-head", 2, 1, 1, 8), ("t5", 2, 1, 1, 8)]
    out = _launch(_train_many, (runs,), 2)
    for rank in out:
        for i, kind in enumerate(("bert", "bert-no-head", "t5")):
            _assert_same(rank[i], encoders_one_process[kind], f"{kind} tp=2")
    bert, no_head = encoders_one_process["bert"], encoders_one_process["bert-no-head"]
    # the binary head: its pooler, sentence-order classifier and token types are built (and trained) or not
    assert any("binary_head" in name for name in bert["weights"]), sorted(bert["weights"])
    assert any("tokentype" in name for name in bert["weights"])
    assert not any("binary_head" in name or "tokentype" in name for name in no_head["weights"])
    for kind in ("bert", "bert-no-head", "t5"):  # it trains: the first batch's loss after 4 steps is lower
        run = encoders_one_process[kind]
        assert run["eval"] < run["losses"][0] - 0.2, (kind, run["losses"], run["eval"])


def test_the_reference_kinds_megatron_core_does_not_have_are_refused_by_name():
    from types import SimpleNamespace

    from accel_nb.megatron.bert import bert_shape
    from accel_nb.megatron.t5 import provide_t5

    classifier = transformers.MegatronBertForSequenceClassification(_hf_model("bert").config)
    with pytest.raises(ValueError, match="fine-tuning BERT .Megatron's Classification model"):
        bert_shape(classifier, None)
    with pytest.raises(ValueError, match="accel_nb builds T5 without pipeline stages"):
        provide_t5(SimpleNamespace(pp_degree=2), None, None, True, True)


def _gpu_losses(precision):
    acc, (engine, _opt, loader) = _prepare("gpt2", 1, 1, 1, 8, precision=precision, clipping=1.0)
    engine.train()
    return [float(engine(**batch)) for _, batch in zip(range(6), loader)]


@pytest.mark.gpu
def test_one_gpu_trains_in_bf16_close_to_fp32():
    """On a GPU, without the stand-ins: bf16 (megatron-core's mixed-precision optimizer) and clipping."""
    fp32 = _launch(_gpu_losses, ("no",), 1, cpu=False)[0]
    bf16 = _launch(_gpu_losses, ("bf16",), 1, cpu=False)[0]
    assert fp32[-1] < fp32[0] - 0.05 and bf16[-1] < bf16[0] - 0.05, (fp32, bf16)
    np.testing.assert_allclose(bf16, fp32, rtol=0.03)


# ------------------------------------------------------------------ checkpoints, metrics


def _resume(folder, phase):
    acc, (engine, opt, loader, sched) = _prepare("gpt2", 2, 1, 1, 8, scheduler=True)
    refused = None
    if phase == "load":
        # first a copy that lacks rank 1's slice: refused on every rank, nothing loaded anywhere
        broken = os.path.join(folder, "broken")
        if acc.is_main_process:
            shutil.copytree(os.path.join(folder, "ckpt"), broken)
            os.remove(os.path.join(broken, "megatron", "mp_rank_01_000.pt"))
        acc.wait_for_everyone()
        before = engine.full_weights()
        try:
            acc.load_state(broken)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            refused = f"{type(exc).__name__}: {exc}"
        after = engine.full_weights()
        refused = (refused, all(torch.equal(before[k], after[k]) for k in before))
        acc.load_state(os.path.join(folder, "ckpt"))
    engine.train()
    batches = iter(loader)
    losses, lrs = [], []

    def steps(k):
        for _ in range(k):
            losses.append(float(engine(**next(batches))))
            lrs.append(sched.get_last_lr()[0])

    if phase == "save":
        steps(3)
        acc.save_state(os.path.join(folder, "ckpt"))
        steps(3)
        return {
            "losses": losses[3:],
            "lrs": lrs[3:],
            "files": sorted(os.listdir(os.path.join(folder, "ckpt"))),
        }
    steps(3)  # load_state put the loader where the first run saved it
    # gather_for_metrics over the data-parallel ranks only: tp=2 ranks hold the same samples, none repeated
    ids = acc.gather_for_metrics(next(batches)["input_ids"])
    # a loader prepared later gets the engine's batches (micro-batch 8 x 1), whatever its own batch size
    later = acc.prepare(torch.utils.data.DataLoader(_data(16), batch_size=4))
    return {
        "losses": losses,
        "lrs": lrs,
        "gathered": ids.shape[0],
        "later": len(next(iter(later))["input_ids"]),
        "refused": refused,
    }


@pytest.mark.multiproc
def test_a_fresh_model_gives_the_same_loss_after_loading_its_own_full_weights():
    # the vocabulary's padding rows (100 -> 128) are part of the softmax: full_weights leaves them out and
    # load_full_weights fills zeros, so a fresh model starts with them at zero too
    before, after = _launch(_fresh_round_trip, ("gpt2",), 1)[0]
    assert before == after


@pytest.mark.multiproc
def test_save_state_then_load_state_in_a_new_launch_continues_identically(tmp_path):
    first = _launch(_resume, (str(tmp_path), "save"), 2)
    second = _launch(_resume, (str(tmp_path), "load"), 2)
    assert second[0]["losses"] == first[0]["losses"] and len(first[0]["losses"]) == 3
    assert second[0]["lrs"] == first[0]["lrs"]
    assert "megatron" in first[0]["files"]
    assert sorted(os.listdir(tmp_path / "ckpt" / "megatron")) == ["mp_rank_00_000.pt", "mp_rank_01_000.pt"]
    # one data-parallel rank: 8 samples, not 16
    assert second[0]["gathered"] == 8 and second[1]["gathered"] == 8
    assert second[0]["later"] == 8
    for rank in second:  # the copy without rank 1's slice: an error on both ranks, the weights untouched
        message, untouched = rank["refused"]
        assert "mp_rank_01_000.pt" in message and untouched, rank["refused"]


# ------------------------------------------------------------------ refusals (no rank starts)


def test_without_a_gpu_megatron_is_refused_before_anything_starts():
    from accel_nb import Accelerator
    from accel_nb.megatron import MegatronLMPlugin

    with pytest.raises(RuntimeError, match="needs a CUDA GPU: megatron-core calls CUDA directly"):
        Accelerator(megatron_lm_plugin=MegatronLMPlugin(gradient_clipping=0.0))


@pytest.mark.parametrize(
    "settings, precision, message",
    [
        ({}, "bf16", "mixed_precision='bf16' with Megatron-LM runs on GPUs only"),
        ({}, "fp8", "mixed_precision='fp8' with Megatron-LM needs Transformer Engine"),
        ({"use_distributed_optimizer": True}, "no", r"use_distributed_optimizer=True\) runs on GPUs only"),
        ({"sequence_parallelism": True}, "no", r"sequence_parallelism=True\) runs on GPUs only"),
        ({"gradient_clipping": 1.0}, "no", r"gradient_clipping=1.0\) runs on GPUs only"),
        (
            {"tp_degree": 2},
            "no",
            r"needs a number of processes divisible by 2 \(tp x pp\); this launch has 1",
        ),
        ({"tensorboard_dir": "tb"}, "no", "is not supported by accel_nb: megatron.training's logger"),
        ({"context_parallel_size": 2}, "no", "context parallelism needs Transformer Engine"),
    ],
)
def test_what_only_a_gpu_runs_and_what_is_not_built_are_refused(fresh_state, settings, precision, message):
    import accel_nb.megatron.checks as checks
    from accel_nb import Accelerator
    from accel_nb.megatron import MegatronLMPlugin

    fresh_state.setattr(
        checks, "require_gpu", lambda what: None
    )  # the test-only switch (no CUDA stand-ins needed)
    settings = {"gradient_clipping": 0.0, **settings}
    with pytest.raises(ValueError, match=message):
        Accelerator(mixed_precision=precision, megatron_lm_plugin=MegatronLMPlugin(**settings))


def test_the_plugin_reads_the_reference_environment(fresh_state):
    from accel_nb.megatron import MegatronLMPlugin
    from accel_nb.megatron.plugin import plugin_from_env
    from accel_nb.utils import is_megatron_lm_available

    fresh_state.setenv("MEGATRON_LM_TP_DEGREE", "2")
    fresh_state.setenv("MEGATRON_LM_NUM_MICRO_BATCHES", "4")
    fresh_state.setenv("MEGATRON_LM_SEQUENCE_PARALLELISM", "true")
    assert plugin_from_env() is None and not is_megatron_lm_available()  # not asked for
    fresh_state.setenv("ACCELERATE_USE_MEGATRON_LM", "true")
    assert is_megatron_lm_available()  # asked for, and megatron-core is installed
    plugin = plugin_from_env()
    assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches) == (2, 1, 4)
    assert plugin.sequence_parallelism is True and plugin.gradient_clipping == 1.0
    assert MegatronLMPlugin(tp_degree=1).tp_degree == 1  # an argument wins over the environment
    fresh_state.setenv("MEGATRON_LM_PP_DEGREE", "two")
    with pytest.raises(ValueError, match="MEGATRON_LM_PP_DEGREE='two' is not a whole number"):
        MegatronLMPlugin()
    with pytest.raises(
        ValueError, match=r"MegatronLMPlugin\(num_micro_batches=0\): a whole number of at least 1"
    ):
        MegatronLMPlugin(pp_degree=1, num_micro_batches=0)


# ------------------------------------------------------------------ the launch: config file and flags


def test_a_megatron_lm_config_becomes_the_reference_environment_and_flags():
    from accel_nb.accelerator.backends.megatron import MegatronBackend
    from accel_nb.config import ConfigError, LaunchConfig

    settings = {
        "megatron_lm_tp_degree": 2,
        "megatron_lm_num_micro_batches": 4,
        "megatron_lm_eod_mask_loss": True,
    }
    cfg = LaunchConfig(
        distributed_type="MEGATRON_LM", num_processes=4, extras={"megatron_lm_config": settings}
    )
    env = cfg.to_env()
    assert env["ACCELERATE_USE_MEGATRON_LM"] == "true"
    assert (env["MEGATRON_LM_TP_DEGREE"], env["MEGATRON_LM_NUM_MICRO_BATCHES"]) == ("2", "4")
    assert env["MEGATRON_LM_EOD_MASK_LOSS"] == "true"
    # %%accelerate reads the saved config too: its ranks get the same Megatron-LM settings
    from accel_nb.notebook.magic_flags import launch_options, parse_accelerate_line

    magic_env = launch_options(parse_accelerate_line("-n 4"), cfg).env
    assert {k: v for k, v in magic_env.items() if "MEGATRON" in k} == {
        k: v for k, v in env.items() if "MEGATRON" in k
    }
    flags = MegatronBackend.launch_flags(cfg)
    assert flags[0] == "--use_megatron_lm" and flags[flags.index("--megatron_lm_tp_degree") + 1] == "2"
    assert (
        "ACCELERATE_USE_MEGATRON_LM"
        not in LaunchConfig(distributed_type="MULTI_CPU", num_processes=2).to_env()
    )
    with pytest.raises(
        ConfigError, match="megatron_lm_config has 'megatron_lm_tp_size'.*megatron_lm_ \\+ one of"
    ):
        LaunchConfig(
            distributed_type="MEGATRON_LM",
            num_processes=2,
            extras={"megatron_lm_config": {"megatron_lm_tp_size": 2}},
        ).validate()


@pytest.mark.multiproc
def test_accel_nb_launch_use_megatron_lm_on_a_machine_without_gpus_starts_no_rank(tmp_path):
    from tests.test_cli import accel_nb

    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    out = accel_nb(
        "launch",
        "--use_megatron_lm",
        "--megatron_lm_tp_degree",
        "2",
        "--num_processes",
        "2",
        str(script),
        cfg=str(tmp_path / "none.yaml"),
    )
    assert out.returncode != 0 and "ran" not in out.stdout
    assert "Megatron-LM needs CUDA GPUs" in out.stderr, out.stderr


def test_accel_nb_config_offers_megatron_on_a_gpu_machine(fresh_state, tmp_path):
    """The questionnaire as a person with 4 GPUs answers it (the hardware and the keyboard stood in for)."""
    import io

    import accel_nb.commands.config as config_command
    from accel_nb.config.command_line import launch_command_line
    from accel_nb.hardware import GPUInfo, HardwareInfo

    gpus = [
        GPUInfo(index=i, name="NVIDIA H100", total_memory=80 * 2**30, compute_capability=(9, 0), bf16=True)
        for i in range(4)
    ]
    hw = HardwareInfo(
        cpu_physical_cores=8,
        cpu_logical_cores=16,
        ram_total=2**36,
        ram_available=2**35,
        gpus=gpus,
        nvml_available=True,
    )
    fresh_state.setattr(config_command, "detect", lambda: hw)

    def answer(replies):
        it = iter(replies)
        fresh_state.setattr("builtins.input", lambda prompt="": next(it))
        out = io.StringIO()
        return config_command.questionnaire(str(tmp_path / "none.yaml"), out=out), out.getvalue()

    deepspeed = ["no"] if config_command.deepspeed_installed() else []
    first = ["gpu", "", "", "", "", ""] + deepspeed
    cfg, text = answer([*first, "maybe", "yes", "3", "2", "", "2", "4", "", "", "", ""])
    assert "! use_megatron_lm='maybe' is not valid" in text
    assert "! megatron_lm_tp_degree='3' is not valid" in text and "dividing the 4 processes" in text
    assert "FullyShardedDataParallel" not in text and "torch.compile" not in text  # not with Megatron-LM
    assert (cfg.distributed_type, cfg.num_processes, cfg.use_cpu) == ("MEGATRON_LM", 4, False)
    assert cfg.extras["megatron_lm_config"] == {
        "megatron_lm_tp_degree": 2,
        "megatron_lm_sequence_parallelism": False,
        "megatron_lm_pp_degree": 2,
        "megatron_lm_num_micro_batches": 4,
        "megatron_lm_recompute_activations": False,
        "megatron_lm_use_distributed_optimizer": False,
        "megatron_lm_gradient_clipping": 1.0,
    }
    assert "--use_megatron_lm --megatron_lm_tp_degree 2" in launch_command_line(cfg)
    # on CPU it is not offered (a CPU machine cannot run it)
    cfg, text = answer(["cpu", "", "2", "", ""] + deepspeed + ["", "", "", ""])
    assert "Megatron" not in text and cfg.distributed_type == "MULTI_CPU"
