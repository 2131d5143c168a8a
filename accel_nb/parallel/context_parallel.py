"""Context parallel: the sequence split over the ``cp`` ranks, attention computed against the whole
sequence's keys and values, with plain collectives (gloo on CPU, NCCL on GPU alike).

    with context_parallel(group, buffers=[input_ids, position_ids, targets], buffer_seq_dims=[1, 1, 1]):
        logits = model(input_ids=input_ids, position_ids=position_ids).logits   # this rank's tokens only

Inside the block each buffer holds this rank's share of the sequence, in the load-balanced layout:
the sequence cut into ``2 × cp`` equal chunks, rank ``r`` keeping chunks ``r`` and ``2·cp − 1 − r``
(so every rank has as much causal-attention work as the others). Every
``torch.nn.functional.scaled_dot_product_attention`` call gathers the keys and values of all the
ranks (an autograd function: all-gather forward, reduce-scatter of the gradients backward) and
attends this rank's queries to them, with the causal mask built from the chunks' global positions.

This is not ring attention: every rank holds the keys and values of the whole sequence during each
attention call (memory O(sequence) for K/V); queries, activations and the MLP work are split.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = [
    "ContextParallelAttention",
    "check_attention_implementation",
    "check_recurrent_layers",
    "check_sequence_length",
    "context_parallel",
    "gather_sequence",
    "local_positions",
    "shard_sequence",
]

_SDPA = F.scaled_dot_product_attention
# torch's parameter names, in order (the builtin has no inspectable signature)
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def check_sequence_length(length: int, cp_size: int) -> None:
    """A clear error when ``length`` does not split into ``2 × cp_size`` equal chunks."""
    chunks = 2 * cp_size
    if length % chunks:
        padded = -(-length // chunks) * chunks
        raise ValueError(
            f"context parallel: sequence length {length} is not divisible by 2 × cp_size = {chunks} (the sequence "
            f"is cut into {chunks} equal chunks, two per rank, to balance causal attention); pad or trim the "
            f"sequences to a multiple of {chunks} (e.g. {padded} or {length - length % chunks})"
        )


def check_attention_implementation(model: torch.nn.Module) -> None:
    """A clear error for a transformers model whose attention is not SDPA: context parallel intercepts
    ``scaled_dot_product_attention`` only, and another implementation would attend to this rank's
    tokens alone (silently wrong)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (None, "sdpa"):
        raise ValueError(
            f"context parallel (cp_size > 1) needs SDPA attention, but this {type(model).__name__} uses "
            f"attn_implementation={implementation!r}; load or build it with attn_implementation='sdpa'"
        )


def check_recurrent_layers(model: Any) -> None:
    """A clear error for a model whose layers carry a state along the sequence (``linear_attention``
    entries of its config's ``layer_types``): they do not go through ``scaled_dot_product_attention``,
    so under a split sequence each rank would restart their state from zero, and the gradients would
    be wrong without any error.

        check_recurrent_layers(qwen3_next_model)   # ValueError naming ['linear_attention']
    """
    config = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):  # a multimodal config keeps the text model's layers there
        config = config.get_text_config()
    recurrent = sorted(
        {kind for kind in getattr(config, "layer_types", None) or [] if "linear_attention" in kind}
    )
    if recurrent:
        raise ValueError(
            f"Sequence parallelism does not support attention layers of type {recurrent} (model "
            f"{model.__class__.__name__}): they carry a state along the sequence outside "
            "scaled_dot_product_attention, so with the sequence split every rank would restart that state and "
            "the gradients would be silently wrong; use a model with full attention only, or cp_size=1"
        )


def local_positions(length: int, cp_size: int, rank: int, device: Any = None) -> torch.Tensor:
    """The global positions of the tokens rank ``rank`` holds: chunks ``rank`` and ``2·cp_size − 1 − rank``."""
    check_sequence_length(length, cp_size)
    chunk = length // (2 * cp_size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    last = torch.arange((2 * cp_size - 1 - rank) * chunk, (2 * cp_size - rank) * chunk, device=device)
    return torch.cat([first, last])


def shard_sequence(tensor: torch.Tensor, dim: int, cp_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s share of ``tensor`` along ``dim`` in the load-balanced layout (a new tensor)."""
    length = tensor.shape[dim]
    check_sequence_length(length, cp_size)
    chunks = tensor.chunk(2 * cp_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * cp_size - 1 - rank]], dim=dim)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim -2 over ``group`` (rank order); backward: each rank gets the sum over the
    ranks of the gradient of its own slice (a reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, world: int, rank: int) -> torch.Tensor:
        ctx.group, ctx.world, ctx.rank = group, world, rank
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local, group=group)
        return torch.cat(parts, dim=-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        parts = [part.contiguous() for part in grad.chunk(ctx.world, dim=-2)]
        out = torch.empty_like(parts[ctx.rank])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return out, None, None, None


def gather_sequence(local: torch.Tensor, group: Any) -> torch.Tensor:
    """``local`` ([..., L, D]) of every rank of ``group`` concatenated along dim -2 in rank order,
    differentiable: the gradient of each rank's slice is summed over the ranks and returned to it."""
    world = dist.get_world_size(group)
    if world == 1:
        return local
    return _GatherSequence.apply(local, group, world, dist.get_rank(group))


class ContextParallelAttention(TorchFunctionMode):
    """While active, ``scaled_dot_product_attention`` on this rank's queries attends to the keys and
    values gathered from every rank of ``group`` (causal masking by global positions)."""

    def __init__(self, group: Any) -> None:
        super().__init__()
        self.group = group
        self.cp_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._positions: dict[tuple[int, Any], tuple[torch.Tensor, torch.Tensor]] = {}

    def _masks_positions(self, local: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        key = (local, device)
        if key not in self._positions:
            length = local * self.cp_size
            queries = local_positions(length, self.cp_size, self.rank, device)
            keys = torch.cat([local_positions(length, self.cp_size, r, device) for r in range(self.cp_size)])
            self._positions[key] = (queries, keys)
        return self._positions[key]

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        return self.attention(*args, **kwargs)

    def attention(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``scaled_dot_product_attention`` of the local queries against every rank's keys and values."""
        extra = set(kwargs) - set(_SDPA_PARAMS)
        if extra or len(args) > len(_SDPA_PARAMS):
            raise TypeError(f"scaled_dot_product_attention got unexpected arguments {sorted(extra)}")
        call = dict(zip(_SDPA_PARAMS, args))
        call.update(kwargs)
        query, key, value = call.pop("query"), call.pop("key"), call.pop("value")
        if call.get("attn_mask") is not None:
            raise ValueError(
                "context parallel computes causal or full attention without a mask: scaled_dot_product_attention "
                "got an attn_mask. Pass no attention_mask to the model (sequences without padding, packed to the "
                "full length), or run this model without cp_size"
            )
        local = query.shape[-2]
        if key.shape[-2] != local or value.shape[-2] != local:
            raise ValueError(
                f"context parallel: attention got {local} queries but {key.shape[-2]} keys on this rank; inside "
                "maybe_context_parallel the keys and values must be this rank's share of the same sequence (no "
                "KV cache: call the model with use_cache=False)"
            )
        causal = bool(call.pop("is_causal", False))
        keys = gather_sequence(key, self.group)
        values = gather_sequence(value, self.group)
        if causal:
            positions, key_positions = self._masks_positions(local, query.device)
            call["attn_mask"] = key_positions.unsqueeze(0) <= positions.unsqueeze(1)
        return _SDPA(query, keys, values, is_causal=False, **call)


def _same(a: torch.Tensor, items: Sequence[torch.Tensor]) -> bool:
    return any(a is b for b in items)


@contextlib.contextmanager
def _no_packed_sequence_detection() -> Iterator[None]:
    """transformers (masking_utils) reads a jump in ``position_ids`` as the start of another packed
    sequence and then builds a block mask; the load-balanced shard's positions jump (rank 0 holds
    0..c-1 and then (2·cp−1)·c..): inside the block that detection is switched off, so the model
    passes no mask and attention is causal over the global positions (packed sequences are not
    supported with context parallel)."""
    module = sys.modules.get("transformers.masking_utils")
    saved = getattr(module, "find_packed_sequence_indices", None)
    if saved is None:
        yield
        return
    module.find_packed_sequence_indices = _no_packing  # type: ignore[union-attr]
    try:
        yield
    finally:
        module.find_packed_sequence_indices = saved  # type: ignore[union-attr]


def _no_packing(position_ids: torch.Tensor) -> None:
    return None


@contextlib.contextmanager
def context_parallel(
    group: Any,
    buffers: Sequence[torch.Tensor] | None = None,
    buffer_seq_dims: Sequence[int] | None = None,
    no_restore_buffers: Any = None,
) -> Iterator[None]:
    """Shard ``buffers`` in place along their sequence dims over ``group``, route attention through
    :class:`ContextParallelAttention`, and on exit give back the whole buffers (except
    ``no_restore_buffers``, which stay this rank's share)."""
    buffers = list(buffers or [])
    dims = list(buffer_seq_dims if buffer_seq_dims is not None else [1] * len(buffers))
    keep = list(no_restore_buffers or [])
    if len(dims) != len(buffers):
        raise ValueError(
            f"maybe_context_parallel got {len(buffers)} buffers but {len(dims)} buffer_seq_dims: give one sequence "
            "dimension per buffer"
        )
    for item in keep:
        if not _same(item, buffers):
            raise ValueError(
                "maybe_context_parallel: every tensor in no_restore_buffers must also be in buffers"
            )
    cp_size, rank = dist.get_world_size(group), dist.get_rank(group)
    lengths = {buffer.shape[dim] for buffer, dim in zip(buffers, dims)}
    if len(lengths) > 1:
        shapes = ", ".join(f"{tuple(b.shape)} (dim {d})" for b, d in zip(buffers, dims))
        raise ValueError(
            f"maybe_context_parallel: the buffers' sequence lengths differ: {shapes}; every buffer must have the "
            "same sequence length along its buffer_seq_dims entry"
        )
    for length in lengths:
        check_sequence_length(length, cp_size)
    originals = [buffer.detach() for buffer in buffers]  # new views of the whole sequences (no copy)
    with torch.no_grad():
        for buffer, whole, dim in zip(buffers, originals, dims):
            buffer.set_(shard_sequence(whole, dim, cp_size, rank))
    try:
        with ContextParallelAttention(group), _no_packed_sequence_detection():
            yield
    finally:
        with torch.no_grad():
            for buffer, whole in zip(buffers, originals):
                if not _same(buffer, keep):
                    buffer.set_(whole)
