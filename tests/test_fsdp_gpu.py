"""FSDP on GPUs (marked gpu; needs 2 CUDA GPUs, NCCL refuses two ranks on one): a GPT-2-small-sized model
(transformers.GPT2Config, no download) trained in bf16 with FSDP and with DDP; both learn, FSDP holds half of
the parameter bytes per GPU. The step times are printed side by side (no time assertion)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from tests.dist_helpers import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc]


def _gpt2_steps(use_fsdp: bool, steps: int = 12):
    from transformers import GPT2Config, GPT2LMHeadModel

    from accel_nb import Accelerator, FSDPOptions
    from accel_nb.fsdp.sharding import local_shard_bytes
    from accel_nb.utils import set_seed

    fsdp = FSDPOptions(auto_wrap_classes=["GPT2Block"]) if use_fsdp else None
    acc = Accelerator(mixed_precision="bf16", fsdp=fsdp)
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=256))
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, opt = acc.prepare(model, opt)
    ids = torch.randint(0, 50257, (8, 256), generator=torch.Generator().manual_seed(acc.process_index)).to(
        acc.device
    )
    times, losses = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return {
        "step_s": statistics.median(times[2:]),
        "losses": losses,
        "param_share": local_shard_bytes(model.parameters()) / full_bytes,
    }


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="FSDP needs 2 GPUs (NCCL cannot run two ranks on one)"
)
def test_gpt2_small_bf16_fsdp_and_ddp_both_learn():
    fsdp = run_ranks(_gpt2_steps, world_size=2, args=(True,), timeout=600)
    ddp = run_ranks(_gpt2_steps, world_size=2, args=(False,), timeout=600)
    for run in (fsdp[0], ddp[0]):
        assert run["losses"][-1] < run["losses"][0]
    assert fsdp[0]["param_share"] < 0.55 and ddp[0]["param_share"] == 1.0
    print(
        f"GPT-2 small bf16, 2 GPUs, batch 8x256 per GPU: FSDP step {fsdp[0]['step_s'] * 1000:.1f} ms, "
        f"DDP step {ddp[0]['step_s'] * 1000:.1f} ms, ratio {fsdp[0]['step_s'] / ddp[0]['step_s']:.2f}"
    )
