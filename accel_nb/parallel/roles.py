"""Each rank's role in a parallel run, told to the launching notebook: its mesh coordinates or pipeline stage.

The launch's per-rank rows show it after the rank (``rank 3 [dp 1 · tp 1]``, ``rank 1 [pp 1/2 · layers 2-3]``).
Outside a launch :func:`accel_nb.events.emit` does nothing, so these calls cost nothing there.

    announce_mesh_role(ParallelismConfig(dp_shard_size=2, tp_size=2), rank=3)   # Role: dp_shard 1, tp 1
    stage_detail(model, ["model.layers.2"], stage=1)                              # 'layers 2-3'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..events import Role, emit, in_launch
from .config import MESH_ORDER

__all__ = ["announce_mesh_role", "announce_stage_role", "mesh_role", "stage_detail", "stage_role"]


def mesh_role(config: Any, rank: int) -> Role:
    """The ``Role`` of the process of global ``rank`` in ``config``'s mesh (every dimension, in mesh order)."""
    coords = config.coordinates(rank)
    return Role(
        rank=rank,
        coords={d: coords[d] for d in MESH_ORDER},
        sizes={d: getattr(config, f"{d}_size") for d in MESH_ORDER},
    )


def announce_mesh_role(config: Any, rank: int) -> bool:
    """Tell the launching process where ``rank`` sits in the mesh (False outside a launch)."""
    return emit(mesh_role(config, rank))


def _block_range(names: Sequence[str]) -> str:
    """``"layers 4-7"`` for ``model.layers.4`` ... ``model.layers.7``; ``"embed … lm_head"`` otherwise."""
    if not names:
        return ""
    heads = {n.rpartition(".")[0] for n in names}
    tails = [n.rpartition(".")[2] for n in names]
    if len(heads) == 1 and all(t.isdigit() for t in tails):
        stack = next(iter(heads)).rpartition(".")[2] or "blocks"
        first, last = tails[0], tails[-1]
        return f"{stack} {first}" if first == last else f"{stack} {first}-{last}"
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}"


def stage_detail(model: Any, split_points: Sequence[str], stage: int) -> str:
    """What stage ``stage`` of ``model`` cut at ``split_points`` holds, in the model's blocks: ``"layers 4-7"``.

    The blocks are the ones the "auto" plan cuts between (the model's ``_no_split_modules``, its stack
    of repeated blocks, or its children); split points that are not such blocks are named as given.
    """
    from .pipeline_split import candidate_split_points  # deferred: pulls in the big-model planner

    points = list(split_points)
    blocks = candidate_split_points(model)
    where = {name: i for i, name in enumerate(blocks)}
    if all(p in where for p in points):
        edges = [0, *(where[p] for p in points), len(blocks)]
        return _block_range(blocks[edges[stage] : edges[stage + 1]])
    if stage == 0:
        return f"up to {points[0]}" if points else ""
    return f"from {points[stage - 1]}"


def stage_role(model: Any, split_points: Sequence[str], stage: int, num_stages: int) -> Role:
    """The ``Role`` of pipeline stage ``stage`` of ``num_stages`` (its rank is the stage's)."""
    try:
        detail = stage_detail(model, split_points, stage)
    except Exception:  # noqa: BLE001 - the stage's blocks are a nicety; the role is shown without them
        detail = ""
    return Role(rank=stage, coords={"pp": stage}, sizes={"pp": num_stages}, detail=detail)


def announce_stage_role(model: Any, split_points: Sequence[str], stage: int, num_stages: int) -> bool:
    """Tell the launching process which pipeline stage this rank runs (False outside a launch)."""
    if not in_launch():  # nothing to tell: skip walking the model
        return False
    return emit(stage_role(model, split_points, stage, num_stages))
