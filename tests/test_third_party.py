"""Third-party code that reads the torchrun environment works unchanged inside a launch."""

from __future__ import annotations

import pytest

from accel_nb import debug_launcher
from accel_nb.launch.parent.reporting import ListReporter

pytestmark = pytest.mark.multiproc


def _hf_trainer(out_dir):
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16))
    data = [
        {"input_ids": torch.randint(0, 50, (8,)), "labels": torch.randint(0, 50, (8,))} for _ in range(16)
    ]
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=2,
        max_steps=3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    weight = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    everyone = [torch.empty_like(weight) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, weight)  # DDP kept the replicas identical
    return (
        args.world_size,
        args.process_index,
        trainer.state.global_step,
        torch.equal(everyone[0], everyone[1]),
    )


def test_hf_trainer_trains_data_parallel_inside_a_launch(tmp_path):
    pytest.importorskip("transformers")
    results = debug_launcher(_hf_trainer, args=(str(tmp_path),), reporter=ListReporter())
    assert results == [(2, 0, 3, True), (2, 1, 3, True)]
