"""Collectives over Megatron's data-parallel group: the reference's Megatron helpers and gather_for_metrics.

Under Megatron-LM the processes of one tensor/pipeline group read the same samples, so gathering over every
process would repeat each sample tp x pp times; these gather over the data-parallel group only.

    preds = gather_across_data_parallel_groups(logits.argmax(-1))
    loss = avg_losses_across_data_parallel_group([loss])[0]
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
    "gather_for_metrics",
]


def _group() -> Any:
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group()


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """The mean of each loss over the data-parallel ranks (one tensor, in the order given)."""
    import torch.distributed as dist

    stacked = torch.cat([loss.detach().clone().reshape(1) for loss in losses])
    dist.all_reduce(stacked, group=_group())
    return stacked / dist.get_world_size(group=_group())


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    group = _group()
    size = dist.get_world_size(group=group)
    length = torch.tensor([tensor.shape[0]], device=tensor.device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    longest = int(max(int(x) for x in lengths))
    padded = tensor
    if tensor.shape[0] < longest:
        padded = torch.cat([tensor, tensor.new_zeros(longest - tensor.shape[0], *tensor.shape[1:])])
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[: int(n)] for part, n in zip(parts, lengths)])


def gather_across_data_parallel_groups(data: Any) -> Any:
    """Every data-parallel rank's tensors (nested lists/tuples/dicts), concatenated along dim 0."""
    from ..ops import recursively_apply

    return recursively_apply(_gather_one, data, error_on_other_type=True)


def _values(data: Any) -> list[Any]:
    if isinstance(data, (list, tuple)):
        return [x for item in data for x in _values(item)]
    if isinstance(data, dict):
        return [x for item in data.values() for x in _values(item)]
    return [data]


def gather_for_metrics(input_data: Any, use_gather_object: bool, gradient_state: Any) -> Any:
    """``Accelerator.gather_for_metrics`` under Megatron: over the data-parallel group, the repeated tail dropped."""
    import torch.distributed as dist

    from ..ops import recursively_apply

    flat = _values(input_data)
    as_objects = use_gather_object or not flat or not all(isinstance(x, torch.Tensor) for x in flat)
    group = _group()
    size = dist.get_world_size(group=group)
    if as_objects:
        parts: list[Any] = [None] * size
        dist.all_gather_object(parts, input_data, group=group)
        data: Any = [x for part in parts for x in (part if isinstance(part, list) else [part])]
    else:
        data = gather_across_data_parallel_groups(input_data)
    if size == 1 or gradient_state is None or not gradient_state.end_of_dataloader:
        return data
    real = getattr(gradient_state.active_dataloader, "last_round_real", None)
    if real is None:
        return data
    return data[:real] if as_objects else recursively_apply(lambda t: t[:real], data)
