"""Library tqdm bars inside a launch: the HF Trainer's own bar becomes the rank's progress row."""

from __future__ import annotations

import pytest

from accel_nb import debug_launcher
from accel_nb.events import Progress
from accel_nb.launch.parent.reporting import ListReporter

pytestmark = pytest.mark.multiproc


def _trainer_with_its_bar(out_dir):
    import torch
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
        disable_tqdm=False,
    )
    Trainer(model=model, args=args, train_dataset=data).train()
    return 0


def test_hf_trainer_tqdm_bar_reports_as_the_main_ranks_progress(tmp_path):
    pytest.importorskip("transformers")
    rep = ListReporter()
    assert debug_launcher(_trainer_with_its_bar, args=(str(tmp_path),), reporter=rep) == [0, 0]
    bars = [e for e in rep.of_type(Progress) if e.rank == 0]
    assert bars, "the Trainer's tqdm bar sent no progress"
    assert bars[-1].n == 3 and bars[-1].total == 3 and bars[-1].done
    assert "it/s]" not in rep.output(), "tqdm drew no text bar into the rank's output"
