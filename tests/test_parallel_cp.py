"""Context parallel (cp_size=2) through Accelerator.prepare and maybe_context_parallel, on real gloo ranks on CPU.

One 2-process launch (cp=2) checks: the attention autograd function against plain SDPA on the whole sequence
(causal and full, GQA, outputs and the gradients of q, k, v); then STEPS training steps of a small
transformers Llama (sdpa attention, sequence 64) whose loss and every parameter's gradient equal the
one-process unsplit run's; both ranks read the same batches; buffers restored or kept sharded on exit;
save_state/load_state resume exactly;
a sequence length not divisible by 2 × cp, an attention mask and a padding mask are clear
errors (an all-ones attention_mask changes nothing). One 4-process launch (cp=2 × tp=2) checks the
same loss and gradients. The rest need no processes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_nb.parallel import ParallelismConfig
from tests.dist_helpers import run_ranks

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state

STEPS = 5
SEQ = 64


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def _tokens() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(0, 64, (4 * STEPS, SEQ + 1), generator=g))


def _attention_checks(group) -> dict:
    """ContextParallelAttention (2 ranks) against SDPA over the whole sequence: outputs and grads, max abs diffs."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from accel_nb.parallel.context_parallel import ContextParallelAttention, shard_sequence

    rank = dist.get_rank(group)
    diffs = {}
    for causal, heads_kv in ((True, 4), (False, 4), (True, 2)):
        g = torch.Generator().manual_seed(7)
        q = torch.randn(2, 4, 16, 8, generator=g, requires_grad=True)
        k = torch.randn(2, heads_kv, 16, 8, generator=g, requires_grad=True)
        v = torch.randn(2, heads_kv, 16, 8, generator=g, requires_grad=True)
        w = torch.randn(2, 4, 16, 8, generator=g)
        gqa = heads_kv != 4
        whole = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        (whole * w).sum().backward()
        local = [shard_sequence(t.detach(), 2, 2, rank).requires_grad_() for t in (q, k, v)]
        with ContextParallelAttention(group):
            out = F.scaled_dot_product_attention(*local, is_causal=causal, enable_gqa=gqa)
        (out * shard_sequence(w, 2, 2, rank)).sum().backward()
        name = f"causal={causal},kv_heads={heads_kv}"
        torch.testing.assert_close(out, shard_sequence(whole.detach(), 2, 2, rank), rtol=1e-6, atol=1e-6)
        diffs[name] = [(out - shard_sequence(whole.detach(), 2, 2, rank)).abs().max().item()]
        for mine, full in zip(local, (q, k, v)):
            expected = shard_sequence(full.grad, 2, 2, rank)
            torch.testing.assert_close(mine.grad, expected, rtol=1e-5, atol=1e-6)
            diffs[name].append((mine.grad - expected).abs().max().item())
    try:
        with ContextParallelAttention(group):
            F.scaled_dot_product_attention(*local, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    except ValueError as exc:
        diffs["mask_error"] = str(exc)
    return diffs


def _train(sizes: dict | None, batch_size: int = 4, checks: bool = True, folder: str | None = None) -> dict:
    """STEPS SGD steps of the Llama, loss = mean next-token cross entropy; each step's loss and full gradients
    (with ``checks``, on the parallel run also the attention-function checks, the bad length and masks, and
    with ``folder`` a save_state/load_state round trip)."""
    import torch.nn.functional as F

    from accel_nb import Accelerator

    acc = Accelerator(parallelism_config=ParallelismConfig(**sizes) if sizes else None)
    out: dict = {}
    if sizes and checks:
        out["attention"] = _attention_checks(acc.torch_device_mesh["cp"].get_group())
    if sizes:
        out["mesh"] = tuple(acc.torch_device_mesh.mesh_dim_names)
        out["cp_rank"] = acc.context_parallel_rank
        out["tp_rank"] = acc.tensor_parallel_rank
    model = _llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)  # momentum: state to save and load
    model, opt, dl = acc.prepare(model, opt, DataLoader(_tokens(), batch_size=batch_size))

    def step(x: torch.Tensor) -> tuple[float, dict]:
        input_ids, targets = x[:, :-1].clone(), x[:, 1:].clone()
        position_ids = torch.arange(SEQ).expand(x.shape[0], SEQ)
        with acc.maybe_context_parallel(
            buffers=[input_ids, position_ids, targets],
            buffer_seq_dims=[1, 1, 1],
            no_restore_buffers={targets},
        ):
            logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            acc.backward(loss)
        out["shapes_after"] = (tuple(input_ids.shape), tuple(position_ids.shape), tuple(targets.shape))
        step_grads = {}
        for name, p in acc.unwrap_model(model).named_parameters():
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            step_grads[name] = grad.detach().clone()
        opt.step()
        opt.zero_grad()
        return acc.reduce(loss.detach(), "mean").item(), step_grads

    losses, grads, seen = [], [], []
    for (x,) in dl:
        seen.append(x[:, 0].tolist())
        loss, step_grads = step(x)
        losses.append(loss)
        grads.append(step_grads)
    out.update(losses=losses, grads=grads, seen=seen)
    if sizes and checks:
        try:
            with acc.maybe_context_parallel(buffers=[torch.zeros(2, 30)], buffer_seq_dims=[1]):
                pass
        except ValueError as exc:
            out["length_error"] = str(exc)
        # an all-ones attention_mask (the reference's example passes one) changes nothing; padding is refused
        ids, pos = x[:, :-1].clone(), torch.arange(SEQ).expand(x.shape[0], SEQ)
        ones, padded = torch.ones_like(ids), torch.ones_like(ids)
        padded[:, :4] = padded[:, 16:20] = 0  # padding in both ranks' shares (0-15, 16-31)
        with (
            torch.no_grad(),
            acc.maybe_context_parallel(buffers=[ids, pos, ones, padded], buffer_seq_dims=[1] * 4),
        ):
            plain = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            masked = model(input_ids=ids, position_ids=pos, attention_mask=ones, use_cache=False).logits
            out["ones_mask_same"] = torch.equal(plain, masked)
            try:
                model(input_ids=ids, position_ids=pos, attention_mask=padded, use_cache=False)
            except ValueError as exc:
                out["padding_error"] = str(exc)
    if (
        folder is not None
    ):  # resume exactly: two steps after save_state, then load_state and the same two again
        import os

        acc.save_state(os.path.join(folder, "ckpt"))
        out["after"] = [step(x)[0] for _ in range(2)]
        acc.load_state(os.path.join(folder, "ckpt"))
        out["again"] = [step(x)[0] for _ in range(2)]
    return out


def _same_as_unsplit(ranks: list, reference: dict) -> None:
    """Every rank's losses and every parameter's full gradient at every step equal the unsplit run's."""
    assert len(reference["losses"]) == STEPS
    for rank in ranks:
        torch.testing.assert_close(rank["losses"], reference["losses"], rtol=1e-6, atol=1e-6)
        for step, (mine, expected) in enumerate(zip(rank["grads"], reference["grads"])):
            assert sorted(mine) == sorted(expected)
            for name, grad in expected.items():
                torch.testing.assert_close(
                    mine[name], grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=name, s=step: f"{n} step {s}: {m}"
                )


@pytest.mark.multiproc
def test_cp2_matches_the_unsplit_run_loss_and_gradients(tmp_path):
    # timeout: a hang guard only (2 ranks importing transformers on a loaded machine are slow)
    ranks = run_ranks(_train, world_size=2, args=({"cp_size": 2}, 4, True, str(tmp_path)), timeout=600)
    reference = _train(None)
    main = ranks[0]
    assert main["mesh"] == ("cp",) and [r["cp_rank"] for r in ranks] == [0, 1]
    for rank in ranks:  # the attention function: asserted on the ranks; the messages come back
        assert "attn_mask" in rank["attention"]["mask_error"]
    assert ranks[0]["seen"] == ranks[1]["seen"] == reference["seen"]  # a cp group reads the same batches
    assert len(main["losses"]) == STEPS
    # buffers whole again on exit, except the no_restore one (this rank's 32 tokens)
    assert main["shapes_after"] == ((4, SEQ), (4, SEQ), (4, SEQ // 2))
    _same_as_unsplit(ranks, reference)
    assert all(r["ones_mask_same"] for r in ranks)
    assert main["again"] == main["after"] and len(main["after"]) == 2  # save_state/load_state resume exactly
    assert all("got an attn_mask" in r["padding_error"] for r in ranks)
    message = main["length_error"]
    assert (
        "sequence length 30 is not divisible by 2 × cp_size = 4" in message and "(e.g. 32 or 28)" in message
    )


@pytest.mark.multiproc
def test_cp2_x_tp2_on_four_ranks_matches_the_unsplit_run():
    ranks = run_ranks(_train, world_size=4, args=({"cp_size": 2, "tp_size": 2}, 4, False), timeout=600)
    reference = _train(None)
    assert ranks[0]["mesh"] == ("cp", "tp")  # tp innermost: ranks 0,1 and 2,3 split the layers
    assert [(r["cp_rank"], r["tp_rank"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["seen"] == reference["seen"] for r in ranks)  # one batch for the whole cp × tp group
    _same_as_unsplit(ranks, reference)


# ------------------------------------------------------------------ no processes needed


def test_the_load_balanced_layout_and_bad_lengths():
    from accel_nb.parallel.context_parallel import check_sequence_length, local_positions, shard_sequence

    assert local_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert local_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    x = torch.arange(16).view(2, 8)
    assert shard_sequence(x, 1, 2, 1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    with pytest.raises(ValueError, match=r"sequence length 10 is not divisible by 2 × cp_size = 4.*12 or 8"):
        check_sequence_length(10, 2)


def test_a_model_without_sdpa_attention_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    from accel_nb.parallel.context_parallel import check_attention_implementation

    check_attention_implementation(_llama())  # sdpa
    check_attention_implementation(torch.nn.Linear(2, 2))  # not a transformers model: nothing to check
    eager = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            attn_implementation="eager",
        )
    )
    with pytest.raises(ValueError, match="needs SDPA attention.*attn_implementation='eager'.*'sdpa'"):
        check_attention_implementation(eager)


def test_without_cp_the_context_does_nothing_and_alltoall_is_refused():
    from accel_nb import Accelerator

    acc = Accelerator()
    x = torch.arange(10).view(1, 10)
    with acc.maybe_context_parallel(buffers=[x], buffer_seq_dims=[1]):
        assert x.shape == (1, 10)
    from accel_nb.parallel.config import TorchContextParallelConfig

    with pytest.raises(ValueError, match="all-to-all exchange is not built"):
        Accelerator(
            parallelism_config=ParallelismConfig(
                cp_size=2, cp_handler=TorchContextParallelConfig(cp_comm_strategy="alltoall")
            )
        )


def test_a_model_with_linear_attention_layers_is_refused_as_by_the_reference():
    from types import SimpleNamespace

    from transformers import Qwen3NextConfig

    from accel_nb.big_modeling import _refuse_recurrent_layers_under_sequence_parallelism as ours
    from accel_nb.parallel.context_parallel import check_recurrent_layers

    recurrent = SimpleNamespace(config=Qwen3NextConfig(num_hidden_layers=4))  # 3 linear-attention layers
    with pytest.raises(ValueError, match=r"\['linear_attention'\].*restart that state.*cp_size=1"):
        check_recurrent_layers(recurrent)
    check_recurrent_layers(_llama())  # full attention only
    check_recurrent_layers(torch.nn.Linear(2, 2))  # no config: nothing to check
    reference = pytest.importorskip("accelerate.big_modeling")
    for model in (recurrent, _llama(), torch.nn.Linear(2, 2)):
        outcomes = []
        for check in (ours, reference._refuse_recurrent_layers_under_sequence_parallelism):
            try:
                check(model)
                outcomes.append("ok")
            except ValueError as exc:
                outcomes.append("linear_attention" in str(exc))
        assert outcomes[0] == outcomes[1]
