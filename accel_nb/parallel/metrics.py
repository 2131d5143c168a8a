"""``gather_for_metrics`` when several processes read the same batch (tensor/context parallel groups):
each data-parallel group's samples are kept once.

    preds = gather_once_per_group(preds, False, gradient_state, group_size=2, world=4)   # tp=2: half of gather()
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import gather, gather_object, recursively_apply

__all__ = ["gather_once_per_group"]


def _tensors_only(data: Any) -> bool:
    if isinstance(data, (list, tuple)):
        return bool(data) and all(_tensors_only(x) for x in data)
    if isinstance(data, dict):
        return bool(data) and all(_tensors_only(x) for x in data.values())
    return isinstance(data, torch.Tensor)


def gather_once_per_group(
    input_data: Any, use_gather_object: bool, gradient_state: Any, group_size: int, world: int
) -> Any:
    """Gather ``input_data`` from every process, keep the first rank of each group of ``group_size``
    consecutive ranks (they read the same batch), then drop the samples ``even_batches`` repeated."""
    as_objects = use_gather_object or not _tensors_only(input_data)
    if as_objects:
        per_rank = gather_object([input_data])
        kept = per_rank[::group_size]
        if all(isinstance(x, (list, tuple)) for x in kept):
            data: Any = [item for part in kept for item in part]
        else:
            data = kept
    else:

        def once(t: torch.Tensor) -> torch.Tensor:  # gather() put each rank's equal-sized part in turn
            return t.reshape(world, -1, *t.shape[1:])[::group_size].reshape(-1, *t.shape[1:])

        data = recursively_apply(once, gather(input_data))
    if gradient_state is None or not gradient_state.end_of_dataloader:
        return data
    real = getattr(gradient_state.active_dataloader, "last_round_real", None)
    if real is None:
        return data
    return data[:real] if as_objects else recursively_apply(lambda t: t[:real], data)
