"""Pipeline-parallel inference: ``prepare_pippy`` cuts a model into one stage per process by layers and runs
microbatches through the stages (torch.distributed.pipelining's ``pipeline`` + ``ScheduleGPipe``).

    model = prepare_pippy(model, split_points="auto", example_args=(input_ids,), num_chunks=4)
    with torch.no_grad():
        logits = model(input_ids)          # the full batch's output on the last process (None elsewhere)

Every process builds the whole model, then keeps running only its own stage. ``example_args`` /
``example_kwargs`` are one batch as the model is called with it (every process passes the same); the
batch is split along dim 0 into ``num_chunks`` microbatches, the stage graphs are traced for that
microbatch shape, and a later call with other shapes traces again (each process agrees on the shapes
with process 0, whose inputs are the ones that run). A batch that ``num_chunks`` does not divide is padded
with copies of its last row; the padding is cut from the output. ``gather_output=True`` hands the output
to every process. Training through a pipeline: :class:`accel_nb.parallel.pipeline_training.PipelineTrainer`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..state import PartialState
from .pipeline_split import check_split_points, plan_split_points
from .roles import announce_stage_role

__all__ = [
    "PipelineInference",
    "describe_inputs",
    "prepare_pippy",
    "split_batch",
    "tensor_kwargs",
    "trace_stage",
]

_MAX_TRACED_SHAPES = 8  # stage graphs kept per model, one per input shape seen (oldest dropped first)


def _map_tensors(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(v, fn)) for k, v in obj.items())
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map_tensors(obj, lambda t: found.append(t) or t)
    return found


def describe_inputs(obj: Any) -> Any:
    """A hashable picture of a nested input: each tensor's shape and dtype, other values as they are."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), str(obj.dtype))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(describe_inputs(o) for o in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, describe_inputs(v)) for k, v in obj.items()))
    return ("value", repr(obj))


def split_batch(
    args: tuple, kwargs: dict, num_chunks: int, what: str = "input"
) -> tuple[tuple, dict, int, int]:
    """``(args, kwargs)`` padded along dim 0 to a multiple of ``num_chunks``: ``(args, kwargs, batch, padded)``.

    Every tensor must have the batch as its first dimension (the pipeline splits each one into microbatches).
    """
    tensors = _tensors((args, kwargs))
    if not tensors:
        raise ValueError(
            f"the pipeline {what} holds no tensor to split into microbatches: pass the model's inputs "
            "(e.g. input_ids) as tensors with the batch as their first dimension."
        )
    sizes = {tuple(t.shape[:1]) for t in tensors}
    if len(sizes) != 1 or () in sizes:
        raise ValueError(
            f"every tensor of the pipeline {what} must have the batch as its first dimension (the pipeline splits "
            f"each one into microbatches along dim 0); got shapes {[tuple(t.shape) for t in tensors]}."
        )
    batch = tensors[0].shape[0]
    padded = -(-batch // num_chunks) * num_chunks
    if padded != batch:
        extra = padded - batch

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t[-1:].expand(extra, *t.shape[1:])])

        args, kwargs = _map_tensors((args, kwargs), pad)
    return args, kwargs, batch, padded


def tensor_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword inputs that hold tensors: the others (``use_cache=False``, ``None``) were traced in as constants."""
    return {k: v for k, v in kwargs.items() if _tensors(v)}


def _first_microbatch(obj: Any, size: int) -> Any:
    return _map_tensors(obj, lambda t: t[:size].detach().to("cpu").contiguous())


def _trim(obj: Any, batch: int, padded: int) -> Any:
    if batch == padded:
        return obj
    return _map_tensors(obj, lambda t: t[:batch] if t.dim() and t.shape[0] == padded else t)


def _stage_split_spec(split_points: Sequence[str]) -> dict:
    from torch.distributed.pipelining import SplitPoint  # deferred: torch.distributed.pipelining is heavy

    return {name: SplitPoint.BEGINNING for name in split_points}


_MISSING = object()


@contextmanager
def _plain_forwards(model: nn.Module, split_points: Sequence[str], forward: Any) -> Iterator[None]:
    """Trace with the model's own forward, and leave no split-point wrappers behind.

    torch's ``pipeline`` wraps each split module's ``forward`` in place; a second trace (new input shapes)
    would wrap it twice, and the model's forward may already be the pipelined one ``prepare_pippy`` set.
    """
    modules = dict(model.named_modules())
    owners = [modules[name] for name in split_points] + [model]
    saved = [(m, k, m.__dict__.get(k, _MISSING)) for m in owners for k in ("forward", "_orig_forward")]
    if forward is not None:
        model.forward = forward
    try:
        yield
    finally:
        for module, key, value in saved:
            if value is _MISSING:
                module.__dict__.pop(key, None)
            else:
                module.__dict__[key] = value


def skip_connections(pipe: Any, mb_args: tuple, mb_kwargs: dict) -> list[tuple[int, list[int]]]:
    """(stage, later stages) for each floating-point value one stage sends to several later ones.

    torch.distributed.pipelining runs such a split forward but cannot run its backward ("Backward of
    skip connections not supported yet", raised in the first step by the sending stage only, while the
    others wait): its stages treat every floating-point value they pass as one that gets a gradient. One
    microbatch goes through the whole split graph on this process to see the values; if that cannot be
    done, nothing is reported (the first step then says it).
    """
    import torch.fx  # deferred: only training asks

    gm = pipe.split_gm
    stages = {n: int(str(n.target).rsplit("_", 1)[1]) for n in gm.graph.nodes if n.op == "call_module"}
    inputs = dict(mb_kwargs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positional = iter(mb_args)
    values: dict[Any, Any] = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            values[n] = out = super().run_node(n)
            return out

    try:
        feed = [inputs[n.name] if n.name in inputs else next(positional) for n in placeholders]
        with torch.no_grad():  # only the values' dtypes matter: no autograd graph for the whole model
            _Recorder(gm).run(*feed)
    except Exception:  # noqa: BLE001 - only a diagnosis: torch's own error still comes at the first step
        return []
    found = []
    for node, value in values.items():
        # torch's stages treat every floating-point value passed between them as one that gets a gradient
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        source = node
        while source not in stages and source.op == "call_function" and source.all_input_nodes:
            source = source.all_input_nodes[0]  # a getitem of a stage's outputs
        later = sorted({stages[u] for u in node.users if u in stages})
        if source in stages and len(later) > 1:
            found.append((stages[source], later))
    return found


def trace_stage(
    model: nn.Module,
    split_points: Sequence[str],
    mb_args: tuple,
    mb_kwargs: dict,
    state: Any,
    forward: Any = None,
    training: bool = False,
):
    """This process's stage of ``model`` cut at ``split_points``, traced for one microbatch's inputs.

    ``forward``: the model's own forward, when its ``forward`` attribute has been replaced since.
    ``training``: refuse, on every process alike, a split whose backward torch cannot run.
    """
    from torch.distributed.pipelining import pipeline  # deferred: torch.distributed.pipelining is heavy

    try:
        with _plain_forwards(model, split_points, forward):
            pipe = pipeline(
                model,
                mb_args=tuple(mb_args),
                mb_kwargs=dict(mb_kwargs or {}),
                split_spec=_stage_split_spec(split_points),
            )
    except Exception as exc:  # noqa: BLE001 - re-raised with what to change
        raise RuntimeError(
            f"torch.distributed.pipelining could not trace {type(model).__name__} with split points "
            f"{list(split_points)}: {type(exc).__name__}: {exc}. The model must be traceable by torch.export "
            "for these inputs (transformers models: pass use_cache=False in the config; avoid data-dependent "
            "Python control flow), and each split point must be a module the forward calls."
        ) from exc
    if pipe.num_stages != state.num_processes:
        raise ValueError(
            f"the traced pipeline has {pipe.num_stages} stages but {state.num_processes} processes run it: a "
            f"split point in {list(split_points)} is not called by the model's forward (or is called inside "
            "another split point's module); choose modules the forward calls one after another."
        )
    skips = skip_connections(pipe, tuple(mb_args), dict(mb_kwargs or {})) if training else []
    if skips:
        sender, receivers = skips[0]
        raise ValueError(
            f"with split points {list(split_points)}, stage {sender} sends one floating-point value to stages "
            f"{', '.join(map(str, receivers))} (a skip connection: e.g. a model whose position embeddings or mask, "
            "computed before the first block, feed every block); torch.distributed.pipelining cannot run the "
            "backward of such a split. Train with 2 stages (nothing can skip a stage then), or with split points "
            "that each value crosses once; inference (prepare_pippy) is not affected."
        )
    stage = pipe.build_stage(state.process_index, device=state.device)
    # the launching notebook's rank rows show the stage: "rank 1 [pp 1/2 · layers 2-3]"
    announce_stage_role(model, split_points, state.process_index, state.num_processes)
    return stage


class PipelineInference:
    """The forward that ``prepare_pippy`` installs: microbatched GPipe inference through this process's stage."""

    def __init__(
        self,
        model: nn.Module,
        split_points: Sequence[str],
        num_chunks: int,
        gather_output: bool,
        original_forward: Any,
        state: Any,
    ) -> None:
        self.model = model
        self.split_points = list(split_points)
        self.num_chunks = num_chunks
        self.gather_output = gather_output
        self.original_forward = original_forward
        self.state = state
        self.schedules: OrderedDict[Any, Any] = OrderedDict()
        self.signature: Any = None

    @property
    def schedule(self) -> Any:
        """The GPipe schedule of the shapes run last."""
        return self.schedules.get(self.signature)

    def build(self, mb_args: tuple, mb_kwargs: dict) -> None:
        """Trace and keep this process's stage for microbatches like ``(mb_args, mb_kwargs)``."""
        from torch.distributed.pipelining import (
            ScheduleGPipe,
        )  # deferred: torch.distributed.pipelining is heavy

        signature = describe_inputs((mb_args, mb_kwargs))
        if signature not in self.schedules:
            stage = trace_stage(
                self.model, self.split_points, mb_args, mb_kwargs, self.state, self.original_forward
            )
            self.schedules[signature] = ScheduleGPipe(stage, self.num_chunks)
            while len(self.schedules) > _MAX_TRACED_SHAPES:
                self.schedules.popitem(last=False)
        self.schedules.move_to_end(signature)
        self.signature = signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self.state
        if state.num_processes == 1:
            return self.original_forward(*args, **kwargs)
        import torch.distributed as dist  # deferred: only a multi-process run needs it

        first, last = state.process_index == 0, state.is_last_process
        message: list[Any] = [None]
        if first:
            args, kwargs, batch, padded = split_batch(args, kwargs, self.num_chunks)
            mb = _first_microbatch((args, kwargs), padded // self.num_chunks)
            signature = describe_inputs(mb)
            message = [(batch, padded, signature, mb if signature not in self.schedules else None)]
        dist.broadcast_object_list(message, src=0)
        batch, padded, signature, mb = message[0]
        if signature not in self.schedules or signature != self.signature:
            if mb is None:  # this process traced these shapes before (process 0 has them too)
                self.schedules.move_to_end(signature)
                self.signature = signature
            else:
                self.build(*mb)
        schedule = self.schedules[signature]
        with torch.no_grad():
            if first:
                args, kwargs = _map_tensors((args, tensor_kwargs(kwargs)), lambda t: t.to(state.device))
                output = schedule.step(*args, **kwargs)
            else:
                output = schedule.step()
        output = _trim(output, batch, padded) if last else None
        if self.gather_output:
            box = [_map_tensors(output, lambda t: t.to("cpu")) if last else None]
            dist.broadcast_object_list(box, src=state.num_processes - 1)
            output = _map_tensors(box[0], lambda t: t.to(state.device))
        return output


def prepare_pippy(
    model: nn.Module,
    split_points: str | Sequence[str] | None = "auto",
    no_split_module_classes: Iterable[str | type] | None = None,
    example_args: tuple | None = (),
    example_kwargs: dict[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool | None = False,
) -> nn.Module:
    """Cut ``model`` into one pipeline stage per process and make its forward run microbatched inference.

        model = prepare_pippy(model, example_args=(input_ids,), num_chunks=4)
        out = model(input_ids)   # the last process gets the output; others get None (all: gather_output=True)

    ``split_points``: ``"auto"`` (stages balanced by parameter bytes, cut in front of whole blocks: the classes
    in ``no_split_module_classes`` or the model's ``_no_split_modules``) or the names of the modules where
    stages 2, 3, ... begin. ``example_args``/``example_kwargs``: one batch as the model is called with it.
    ``num_chunks``: microbatches per batch (default: the number of processes). Returns ``model`` itself.
    """
    from ..availability import is_pippy_available

    if not is_pippy_available():
        raise ImportError(
            "prepare_pippy needs torch.distributed.pipelining (PyTorch 2.4 or later): upgrade torch."
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"prepare_pippy takes a torch.nn.Module, got {type(model).__name__}")
    state = PartialState()
    num_stages = state.num_processes
    if num_chunks is None:
        num_chunks = num_stages
    if not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive int (microbatches per batch), got {num_chunks!r}")
    example_args = tuple(example_args or ())
    example_kwargs = dict(example_kwargs or {})
    if not example_args and not example_kwargs:
        raise ValueError(
            "prepare_pippy needs example inputs to trace the stages: pass example_args=(batch,) or "
            "example_kwargs={...}, one batch exactly as you will call the model with it."
        )
    if split_points is None or split_points == "auto":
        points = plan_split_points(model, num_stages, no_split_module_classes)
    else:
        points = check_split_points(model, split_points, num_stages)
    args, kwargs, _, padded = split_batch(example_args, example_kwargs, num_chunks, what="example inputs")
    previous = model.__dict__.get("pipeline")
    # prepared before (a notebook cell run again): start again from the model's own forward
    original_forward = previous.original_forward if isinstance(previous, PipelineInference) else model.forward
    runner = PipelineInference(model, points, num_chunks, bool(gather_output), original_forward, state)
    if num_stages > 1:
        runner.build(*_first_microbatch((args, kwargs), padded // num_chunks))

    def forward(*call_args: Any, **call_kwargs: Any) -> Any:
        return runner(*call_args, **call_kwargs)

    forward.__wrapped__ = original_forward  # type: ignore[attr-defined]
    model.forward = forward
    model.pipeline = runner
    model.hf_split_points = points  # the reference's attribute names
    model.pippy_stage = runner.schedule
    model._original_forward = original_forward
    return model
