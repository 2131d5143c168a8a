"""Pipeline-parallel training: one stage of the model per process, microbatches through a GPipe or 1F1B
schedule (torch.distributed.pipelining), each stage's optimizer stepping only that stage's parameters.

    trainer = PipelineTrainer(
        model, loss_fn=torch.nn.functional.mse_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),   # a factory: each stage builds its own
        example_args=(x,), n_microbatches=4, schedule="1f1b",
    )
    for x, y in batches:
        loss = trainer.step(x, target=y)        # forward + backward + optimizer step; the mean loss, every rank
    trainer.save_state("ckpt")                 # one file per stage; trainer.load_state("ckpt") resumes exactly

Every process passes the same call (process 0's inputs and the last process's target are the ones used).
``loss_fn(output, target)`` is applied to each microbatch and should average over it: the gradients are the
mean over microbatches, so a batch gives the same loss and gradients as the unsplit model on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ..atomic_files import atomic_write
from ..state import PartialState
from .pipeline import describe_inputs, split_batch, tensor_kwargs, trace_stage
from .pipeline_split import check_split_points, plan_split_points

__all__ = ["PIPELINE_SCHEDULES", "PipelineTrainer"]

PIPELINE_SCHEDULES = ("gpipe", "1f1b")


def _check_optimizer_factory(optimizer: Any) -> Callable[[list[nn.Parameter]], torch.optim.Optimizer]:
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"PipelineTrainer got a {type(optimizer).__name__} built over the model's parameters before the split: "
            "it cannot be staged, since each process owns the parameters (and optimizer state) of its own stage "
            "only. Pass a factory that builds the optimizer from a stage's parameters instead, e.g. "
            "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
        )
    if not callable(optimizer):
        raise TypeError(
            f"optimizer must be a factory taking a stage's parameters, got {type(optimizer).__name__}; e.g. "
            "optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
        )
    return optimizer


class PipelineTrainer:
    """Train ``model`` cut into one pipeline stage per process (see the module docstring for an example).

    ``split_points``: "auto" (balanced by parameter bytes) or the module names where stages 2, 3, ... begin.
    ``example_args``/``example_kwargs``: one training batch's model inputs (shapes stay fixed while training).
    ``n_microbatches`` must divide the batch; ``schedule`` is "gpipe" or "1f1b" (1F1B needs at least as many
    microbatches as stages). ``max_grad_norm``: clip the gradients of the whole model (all stages) to this norm
    before each optimizer step, as ``torch.nn.utils.clip_grad_norm_`` on the unsplit model would.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        example_args: tuple | None = (),
        example_kwargs: dict[str, Any] | None = None,
        n_microbatches: int | None = None,
        schedule: str = "gpipe",
        split_points: str | Sequence[str] | None = "auto",
        no_split_module_classes: Iterable[str | type] | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        factory = _check_optimizer_factory(optimizer)
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(
                f"max_grad_norm must be a positive number (or None: no clipping), got {max_grad_norm!r}"
            )
        self.max_grad_norm = max_grad_norm
        self.last_grad_norm: float | None = None
        if not callable(loss_fn):
            raise TypeError(
                f"loss_fn must be callable as loss_fn(output, target), got {type(loss_fn).__name__}"
            )
        state = PartialState()
        self.state = state
        self.num_stages = state.num_processes
        self.stage_index = state.process_index
        self.n_microbatches = self.num_stages if n_microbatches is None else n_microbatches
        if not isinstance(self.n_microbatches, int) or self.n_microbatches < 1:
            raise ValueError(f"n_microbatches must be a positive int, got {n_microbatches!r}")
        name = str(schedule).lower()
        if name not in PIPELINE_SCHEDULES:
            raise ValueError(f"schedule must be one of {PIPELINE_SCHEDULES}, got {schedule!r}")
        if name == "1f1b" and self.n_microbatches < self.num_stages:
            raise ValueError(
                f"the 1F1B schedule needs at least as many microbatches as stages: n_microbatches="
                f"{self.n_microbatches} < {self.num_stages} stages. Raise n_microbatches or use schedule='gpipe'."
            )
        self.schedule_name = name
        self.loss_fn = loss_fn
        example_args = tuple(example_args or ())
        example_kwargs = dict(example_kwargs or {})
        if not example_args and not example_kwargs:
            raise ValueError(
                "PipelineTrainer needs example inputs to trace the stages: pass example_args=(batch,) or "
                "example_kwargs={...}, one training batch as you will pass it to step()."
            )
        args, kwargs, batch, _ = split_batch(example_args, example_kwargs, 1, what="example inputs")
        self._check_divisible(batch)
        if split_points is None or split_points == "auto":
            self.split_points = plan_split_points(model, self.num_stages, no_split_module_classes)
        else:
            self.split_points = check_split_points(model, split_points, self.num_stages)
        mb = batch // self.n_microbatches
        mb_args, mb_kwargs = (
            [t[:mb] if isinstance(t, torch.Tensor) else t for t in args],
            {k: v[:mb] if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
        )
        self.signature = describe_inputs((args, kwargs))
        self.steps = 0
        if self.num_stages == 1:
            self.model, self._schedule = model.to(state.device), None
        else:
            stage = trace_stage(model, self.split_points, tuple(mb_args), mb_kwargs, state, training=True)
            self.model = stage.submod
            self._schedule = self._make_schedule(stage)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = factory(params)
        self._check_staged(self.optimizer, params)

    # ------------------------------------------------------------------ set-up helpers
    def _check_divisible(self, batch: int) -> None:
        if batch % self.n_microbatches:
            raise ValueError(
                f"a batch of {batch} does not split into {self.n_microbatches} equal microbatches: use a batch "
                f"size that is a multiple of n_microbatches (e.g. drop_last=True in the DataLoader)."
            )

    def _make_schedule(self, stage: Any) -> Any:
        from torch.distributed.pipelining import (  # deferred: torch.distributed.pipelining is heavy
            Schedule1F1B,
            ScheduleGPipe,
        )

        cls = ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B
        return cls(stage, self.n_microbatches, loss_fn=self.loss_fn)

    def _check_staged(self, optimizer: Any, params: list[nn.Parameter]) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned {type(optimizer).__name__}, not a torch.optim.Optimizer"
            )
        own = {id(p) for p in params}
        foreign = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in own]
        if foreign:
            raise ValueError(
                f"the optimizer built for stage {self.stage_index} holds {len(foreign)} parameters of other stages: "
                "the factory must build it from the parameters it is given (optimizer=lambda params: "
                "torch.optim.AdamW(params, lr=...)), not from model.parameters()."
            )

    # ------------------------------------------------------------------ training
    def step(self, *args: Any, target: Any = None, **kwargs: Any) -> float:
        """Forward and backward of one batch through the schedule, then the stage's optimizer step.

        Returns the batch's loss (the mean of the microbatch losses) on every process.
        """
        state = self.state
        if self.num_stages == 1:
            return self._step_one_process(args, kwargs, target)
        import torch.distributed as dist  # deferred: only a multi-process run needs it

        first, last = self.stage_index == 0, state.is_last_process
        box = [describe_inputs((args, kwargs)) if first else None]
        dist.broadcast_object_list(box, src=0)
        if box[0] != self.signature:
            raise ValueError(
                "this batch's inputs differ in shape from example_args/example_kwargs the stages were traced for "
                f"(process 0 got {box[0]}, traced {self.signature}): keep the batch shape fixed (drop_last=True, "
                "padding to one sequence length) or build the PipelineTrainer with example inputs of this shape."
            )
        losses: list[torch.Tensor] = []
        call: dict[str, Any] = {}
        if last:
            call.update(target=_to_device(target, state.device), losses=losses)
        if first:
            self._schedule.step(
                *_to_device(args, state.device), **_to_device(tensor_kwargs(kwargs), state.device), **call
            )
        else:
            self._schedule.step(**call)
        self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        loss = (
            torch.stack([x.detach().float() for x in losses]).mean()
            if last
            else torch.zeros((), dtype=torch.float32)
        )
        loss = loss.to(state.device)
        dist.broadcast(loss, src=state.num_processes - 1)
        return float(loss)

    def _step_one_process(self, args: tuple, kwargs: dict, target: Any) -> float:
        if describe_inputs((args, kwargs)) != self.signature:
            raise ValueError(
                "this batch's inputs differ in shape from the example inputs the trainer was built for"
            )
        n = self.n_microbatches
        device = self.state.device
        args, kwargs, target = _to_device((args, kwargs, target), device)
        total = 0.0
        for i in range(n):

            def chunk(t: Any, i: int = i) -> Any:
                return t.tensor_split(n)[i] if isinstance(t, torch.Tensor) else t

            output = self.model(*[chunk(a) for a in args], **{k: chunk(v) for k, v in kwargs.items()})
            loss = self.loss_fn(output, chunk(target))
            (loss / n).backward()
            total += float(loss.detach()) / n
        self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return total

    def _clip_gradients(self) -> None:
        """Scale every stage's gradients so that the whole model's gradient norm is at most ``max_grad_norm``."""
        if self.max_grad_norm is None:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float32, device=self.state.device)
        for g in grads:
            squares += torch.linalg.vector_norm(g.detach().float()) ** 2
        if self.num_stages > 1:
            import torch.distributed as dist  # deferred: only a multi-process run needs it

            dist.all_reduce(squares)  # the stages hold disjoint parameters: their squares add up
        norm = squares.sqrt()
        self.last_grad_norm = float(norm)
        scale = torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.detach().mul_(scale.to(g.dtype))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (the original names, on the CPU) on process 0; ``{}`` on the others.

        Every process calls it. ``model.load_state_dict(trainer.full_state_dict())`` on process 0 gives the
        unsplit model the trained weights.
        """
        own = {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
        if self.num_stages == 1:
            return own
        import torch.distributed as dist  # deferred: only a multi-process run needs it

        parts: list[Any] | None = [None] * self.num_stages if self.stage_index == 0 else None
        dist.gather_object(own, parts, dst=0)
        merged: dict[str, torch.Tensor] = {}
        for part in parts or []:
            merged.update(part)
        return merged

    # ------------------------------------------------------------------ checkpoints
    def _stage_file(self, folder: str) -> str:
        return os.path.join(folder, f"pipeline_stage_{self.stage_index}_of_{self.num_stages}.pt")

    def state_dict(self) -> dict[str, Any]:
        """This stage's weights, optimizer state, step count and split points."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "split_points": list(self.split_points),
            "num_stages": self.num_stages,
        }

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the same split points and number of stages)."""
        if (
            blob.get("num_stages") != self.num_stages
            or list(blob.get("split_points", ())) != self.split_points
        ):
            raise ValueError(
                f"this checkpoint holds {blob.get('num_stages')} stages split at {blob.get('split_points')}, but "
                f"the trainer has {self.num_stages} split at {self.split_points}: resume with the same number of "
                "processes and split points."
            )
        self.model.load_state_dict(blob["model"])
        self.optimizer.load_state_dict(blob["optimizer"])
        self.steps = int(blob["steps"])

    def save_state(self, folder: str) -> str:
        """Write this stage's state to ``folder`` (one file per stage, written atomically); every process calls it."""
        os.makedirs(folder, exist_ok=True)
        path = self._stage_file(folder)
        blob = self.state_dict()
        atomic_write(path, lambda tmp: torch.save(blob, tmp))
        self.state.wait_for_everyone()
        return path

    def load_state(self, folder: str) -> None:
        """Resume from :meth:`save_state`'s folder; every process loads its own stage's file."""
        path = self._stage_file(folder)
        if not os.path.exists(path):
            found = (
                sorted(f for f in os.listdir(folder) if f.startswith("pipeline_stage_"))
                if os.path.isdir(folder)
                else []
            )
            raise FileNotFoundError(
                f"no pipeline stage file {os.path.basename(path)} in {folder!r} (found {found or 'none'}): load a "
                f"folder that save_state wrote with {self.num_stages} processes."
            )
        self.load_state_dict(torch.load(path, map_location=self.state.device, weights_only=True))
        self.state.wait_for_everyone()


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj
