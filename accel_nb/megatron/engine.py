"""``MegatronEngine``: the prepared model, whose forward is a whole Megatron training step (the reference's).

``engine(**batch)`` in train mode cuts the batch into ``num_micro_batches`` micro-batches, runs megatron-core's
forward-backward schedule (with pipeline stages when ``pp_degree`` > 1), reduces the gradients (Megatron's
DDP), steps the optimizer and the scheduler, and returns the loss averaged over micro-batches and data-parallel
ranks (on every rank: the last pipeline stage's loss is sent to the others). In eval mode it returns the loss
without training. ``accelerator.backward``, ``optimizer.step`` and ``scheduler.step`` do nothing.

    model.train(); loss = model(**batch)          # one optimizer step
    model.eval(); loss = model(**batch)           # the loss only
"""

from __future__ import annotations

import contextlib
import os
from functools import partial
from typing import Any

import torch

# what save_state writes for the optimizer and scheduler: their state is in each slice's file (megatron/)
# the parts of the loss a step's loss function reports as [sum, count] (the engine returns their averages' sum)
REPORTED = ("lm loss", "sop loss")
SAVED_WITH_ENGINE = {"megatron_lm": "saved with the model's tensor/pipeline slices under megatron/"}

__all__ = ["GptTrainStep", "MegatronEngine", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper"]


class GptTrainStep:
    """How a GPT batch becomes Megatron's inputs and its loss (the reference's GPTTrainStep, for torch batches).

    ``input_ids`` [b, s] are the tokens; the labels are the tokens shifted left with the end-of-text token
    appended, every position counted in the loss (``eod_mask_loss``: end-of-text positions not counted).
    """

    def __init__(self, plugin: Any, eos_token_id: int) -> None:
        self.eod = eos_token_id
        self.eod_mask_loss = bool(plugin.eod_mask_loss)
        self.get_batch = plugin.custom_get_batch_function or self.batch
        self.loss_func = plugin.custom_loss_function or self.loss

    def batch(self, data_iterator: Any) -> tuple[torch.Tensor, ...]:
        data = next(data_iterator)
        tokens = data["input_ids"].long()
        device = torch.device("cuda", torch.cuda.current_device()) if tokens.is_cuda else tokens.device
        tokens = tokens.to(device)
        labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], self.eod)], dim=1)
        loss_mask = torch.ones(tokens.shape, dtype=torch.float, device=device)
        if self.eod_mask_loss:
            loss_mask[tokens == self.eod] = 0.0
        seq = tokens.shape[1]
        position_ids = torch.arange(seq, device=device).unsqueeze(0).expand_as(tokens)
        attention_mask = torch.ones(seq, seq, device=device).tril().lt(0.5).view(1, 1, seq, seq)
        return tokens, labels, loss_mask, attention_mask, position_ids

    def loss(self, loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The summed token loss, the token count, and the mean for the report (Megatron's 3-part contract)."""
        mask = loss_mask.reshape(-1).float()
        total = torch.sum(output_tensor.float().reshape(-1) * mask)
        count = mask.sum().to(torch.int)
        return total, count, {"lm loss": torch.stack([total.detach(), mask.sum().detach()])}

    def forward_step(self, data_iterator: Any, model: Any) -> tuple[Any, Any]:
        tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
        output = model(tokens, position_ids, attention_mask, labels=labels)
        return output, partial(self.loss_func, loss_mask)


class MegatronLMOptimizerWrapper(torch.optim.Optimizer):
    """What ``prepare`` returns for the optimizer: the engine's forward steps it, so ``step``/``zero_grad`` do nothing."""

    def __init__(self, optimizer: Any) -> None:  # noqa: D107 - no torch.optim.Optimizer.__init__: no own params
        self.optimizer = optimizer
        self.skipped_iter = False
        self.engine: Any = None  # the engine it steps with (set by prepare)
        self.pending: Any = None  # a slice's state load_state read, applied with this optimizer's turn

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return getattr(self.optimizer, "defaults", {})

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing: the engine's forward zeroes the gradient buffers before each step."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Nothing: the engine's forward stepped already."""

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step was skipped (an fp16 overflow)."""
        return self.skipped_iter

    def state_dict(self) -> dict[str, Any]:
        """A marker: each tensor/pipeline slice saves its optimizer state with the engine (save_state)."""
        return dict(SAVED_WITH_ENGINE)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """For the marker: the engine's slice state that load_state read is loaded now (weights, optimizer,
        scheduler), once every part of the checkpoint was read; a state of this rank's optimizer otherwise."""
        if state.get("megatron_lm") != SAVED_WITH_ENGINE["megatron_lm"]:
            self.optimizer.load_state_dict(state)
        elif self.pending is not None and self.engine is not None:
            pending, self.pending = self.pending, None
            self.engine.apply_checkpoint(pending)


class MegatronLMSchedulerWrapper:
    """What ``prepare`` returns for a ``MegatronLMDummyScheduler``: the engine steps Megatron's scheduler."""

    def __init__(self, scheduler: Any, optimizer: Any) -> None:
        self.scheduler = scheduler
        self.optimizer = optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine's forward stepped it."""

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """A marker: the engine saves the scheduler with each slice (save_state)."""
        return dict(SAVED_WITH_ENGINE)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scheduler is not None and state.get("megatron_lm") != SAVED_WITH_ENGINE["megatron_lm"]:
            self.scheduler.load_state_dict(state)


class MegatronEngine(torch.nn.Module):
    """The prepared model: Megatron's DDP-wrapped model chunk, its optimizer and scheduler, one step per forward."""

    def __init__(
        self, plugin: Any, chunks: list[Any], optimizer: Any, scheduler: Any, step: Any, shape: Any
    ) -> None:
        super().__init__()
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.utils import get_model_config

        self.plugin = plugin
        self.module = torch.nn.ModuleList(chunks)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_step_handler = step
        self.shape = shape
        self.iteration = 0
        config = get_model_config(chunks[0])
        config.grad_scale_func = optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
        self.module_config = config

    @property
    def base_model(self) -> Any:
        """This rank's megatron-core model (inside Megatron's DDP)."""
        return self.module[0].module

    def _micro_batches(self, batch: dict[str, Any]) -> Any:
        plugin = self.plugin
        chunks = []
        size = plugin.micro_batch_size
        first = next(iter(batch.values()))
        if first.shape[0] != size * plugin.num_micro_batches:
            raise ValueError(
                f"a batch of {first.shape[0]} samples does not make {plugin.num_micro_batches} micro-batches of "
                f"{size} (the loader's batch size): give the engine whole batches from the prepared loader "
                "(drop_last=True keeps the last one whole)"
            )
        for i in range(plugin.num_micro_batches):
            chunks.append({k: v[i * size : (i + 1) * size] for k, v in batch.items()})
        return iter(chunks)

    def _run(self, batch: dict[str, Any], forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        seq = (batch["input_ids"] if "input_ids" in batch else next(iter(batch.values()))).shape[1]
        return get_forward_backward_func()(
            forward_step_func=self.train_step_handler.forward_step,
            data_iterator=self._micro_batches(batch),
            model=list(self.module),
            num_microbatches=self.plugin.num_micro_batches,
            seq_length=seq,
            micro_batch_size=self.plugin.micro_batch_size,
            forward_only=forward_only,
        )

    def _report(self, reports: list[Any]) -> torch.Tensor:
        """The mean loss over micro-batches and data-parallel ranks, on every rank of the pipeline."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        # on the GPU for NCCL (which has no CPU tensors); on the CPU with gloo
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        # one [sum, count] row per part of the loss (BERT: the masked-LM and the sentence-order losses)
        total = torch.zeros(len(REPORTED), 2, dtype=torch.float64, device=device)
        for item in reports:
            for row, key in enumerate(REPORTED):
                value = item.get(key) if isinstance(item, dict) else None
                if value is not None:
                    total[row] += value.detach().double().reshape(-1)[:2].to(total.device)
        if ps.is_pipeline_last_stage(ignore_virtual=True):
            dist.all_reduce(total, group=ps.get_data_parallel_group())
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast(
                total,
                ps.get_pipeline_model_parallel_last_rank(),
                group=ps.get_pipeline_model_parallel_group(),
            )
        # the reference's returned loss: the sum of the reported parts' averages
        return (total[:, 0] / total[:, 1].clamp(min=1)).sum().float().cpu()

    def train_step(self, **batch: Any) -> torch.Tensor:
        """One optimizer step on ``batch``; the mean loss."""
        for chunk in self.module:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        reports = self._run(batch, forward_only=False)
        ok, _grad_norm, _zeros = self.optimizer.step()
        if ok and self.scheduler is not None:
            self.scheduler.step(increment=1)
        self.skipped_iter = not ok
        self.iteration += 1
        return self._report(reports)

    def eval_step(self, **batch: Any) -> torch.Tensor:
        """The mean loss on ``batch``, without training."""
        with torch.no_grad():
            return self._report(self._run(batch, forward_only=True))

    def forward(self, **batch: Any) -> torch.Tensor:
        return self.train_step(**batch) if self.module[0].training else self.eval_step(**batch)

    # -- weights and checkpoints --------------------------------------------------------------------
    def full_weights(self) -> dict[str, Any]:
        """The whole model's weights in the one-process layout (every rank calls it; every rank gets them)."""
        from .model import full_weights

        return full_weights(self.base_model, self.shape.vocab_size if self.shape is not None else None)

    def load_full_weights(self, weights: dict[str, Any]) -> None:
        """Load a one-process state dict (``full_weights``'s layout) into this rank's slices."""
        from .model import load_full_weights

        load_full_weights(self.base_model, weights)
        with contextlib.suppress(AttributeError):
            self.optimizer.reload_model_params()  # fp16/bf16: the fp32 main copies follow

    def checkpoint_name(self, folder: str) -> str:
        from megatron.core import parallel_state as ps

        tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        return os.path.join(folder, "megatron", f"mp_rank_{tp:02d}_{pp:03d}.pt")

    def save_checkpoint(self, folder: str) -> None:
        """Every rank: each tensor/pipeline slice writes its part (data-parallel rank 0 of each slice)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if ps.get_data_parallel_rank() == 0:
            path = self.checkpoint_name(folder)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            state = {"model": self.base_model.state_dict(), "iteration": self.iteration}
            if not self.plugin.no_save_optim:
                state["optimizer"] = self.optimizer.state_dict()
                state["scheduler"] = self.scheduler.state_dict() if self.scheduler is not None else None
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()

    def load_checkpoint(self, folder: str) -> None:
        """Every rank reads its slice's part (written with the same tp/pp degrees) and loads it."""
        self.apply_checkpoint(self.read_checkpoint(folder))

    def read_checkpoint(self, folder: str) -> dict[str, Any]:
        """This slice's saved state, read (nothing changed yet); a clear error when the file is missing."""
        from megatron.core import parallel_state as ps

        path = self.checkpoint_name(folder)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is missing: a Megatron checkpoint is read with the tp/pp degrees it was saved with "
                f"(this run: tp={ps.get_tensor_model_parallel_world_size()}, "
                f"pp={ps.get_pipeline_model_parallel_world_size()})"
            )
        return torch.load(path, map_location="cpu", weights_only=False)

    def apply_checkpoint(self, state: dict[str, Any]) -> None:
        """Load what ``read_checkpoint`` read: the weights, the iteration, the optimizer and scheduler states."""
        self.base_model.load_state_dict(state["model"])
        self.iteration = int(state["iteration"])
        if "optimizer" in state and not self.plugin.no_load_optim:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state.get("scheduler") is not None:
                self.scheduler.load_state_dict(state["scheduler"])
        else:
            with contextlib.suppress(AttributeError):
                self.optimizer.reload_model_params()
