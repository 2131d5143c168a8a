"""Where to cut a model into pipeline stages: checked user split points, or a plan balanced by parameter bytes.

    plan_split_points(model, num_stages=2)                      # ['model.layers.2']
    check_split_points(model, ["model.layers.2"], num_stages=2)  # the same names, or a ValueError saying why

A split point names a module; its stage begins where that module is called (torch's
``SplitPoint.BEGINNING``). The "auto" plan cuts only in front of whole blocks: the classes in
``no_split_module_classes`` (default: the model's own ``_no_split_modules``, as transformers models
declare them), else the items of the model's stack of repeated blocks (an ``nn.ModuleList`` of one
class), else the model's direct children. Among those cuts it picks the ones that make the largest
stage as small as possible, counting each tensor's bytes once (tied weights once) with the same
measure the big-model planner uses (``accel_nb.big_model.planning.sizes``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from torch import nn

from ..big_model.module_helpers import is_repeated_blocks
from ..big_model.planning.sizes import is_no_split, named_tensors, tensor_bytes

__all__ = ["candidate_split_points", "check_split_points", "plan_split_points", "stage_bytes"]


def _no_split_classes(model: nn.Module, no_split_module_classes: Iterable[str | type] | None) -> list:
    if no_split_module_classes is not None:
        return list(no_split_module_classes)
    return list(getattr(model, "_no_split_modules", None) or [])


def candidate_split_points(
    model: nn.Module, no_split_module_classes: Iterable[str | type] | None = None
) -> list[str]:
    """Module names, in the model's order, in front of which the "auto" plan may cut."""
    classes = _no_split_classes(model, no_split_module_classes)
    names: list[str] = []
    if classes:
        inside: str | None = None
        for name, module in model.named_modules():
            if inside is not None and name.startswith(inside + "."):
                continue
            if name and is_no_split(module, classes):
                names.append(name)
                inside = name
    if not names:
        stacks = [(n, m) for n, m in model.named_modules() if is_repeated_blocks(m)]
        if stacks:
            stack_name, stack = max(stacks, key=lambda item: len(item[1]))
            names = [f"{stack_name}.{i}" if stack_name else str(i) for i in range(len(stack))]
        else:
            names = [n for n, _ in model.named_children()]
    return names


def _prefix_bytes(model: nn.Module, names: Sequence[str]) -> tuple[dict[str, int], int]:
    """For each name: bytes of the tensors registered before the module's first tensor; and the total."""
    first_seen: dict[str, int] = {}
    running = 0
    pending = list(names)
    for tensor_name, tensor in named_tensors(model):
        for name in [n for n in pending if tensor_name.startswith(n + ".")]:
            first_seen[name] = running
            pending.remove(name)
        running += tensor_bytes(tensor)
    return first_seen, running


def stage_bytes(model: nn.Module, split_points: Sequence[str]) -> list[int]:
    """Parameter and buffer bytes of each stage that ``split_points`` make (in registration order)."""
    prefix, total = _prefix_bytes(model, split_points)
    cuts = sorted(prefix.get(n, total) for n in split_points)
    edges = [0, *cuts, total]
    return [b - a for a, b in zip(edges, edges[1:])]


def plan_split_points(
    model: nn.Module, num_stages: int, no_split_module_classes: Iterable[str | type] | None = None
) -> list[str]:
    """``num_stages - 1`` split points that balance the stages' parameter bytes (smallest largest stage)."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if num_stages == 1:
        return []
    names = candidate_split_points(model, no_split_module_classes)
    prefix, total = _prefix_bytes(model, names)
    # a cut where nothing comes before it would leave the first stage empty
    cuts = [(n, prefix[n]) for n in names if prefix.get(n, 0) > 0]
    if len(cuts) < num_stages - 1:
        raise ValueError(
            f"cannot split this {type(model).__name__} into {num_stages} pipeline stages: it has only "
            f"{len(cuts) + 1} blocks to place ({', '.join(names) or 'no submodules'}). Launch at most "
            f"{len(cuts) + 1} processes, or pass split_points=[...] naming the modules where stages begin."
        )
    # exact partition: best[j][i] = smallest largest stage when the j-th cut is cuts[i]
    positions = [p for _, p in cuts]
    inf = float("inf")
    best = [[inf] * len(cuts) for _ in range(num_stages - 1)]
    back = [[-1] * len(cuts) for _ in range(num_stages - 1)]
    for i, p in enumerate(positions):
        best[0][i] = p
    for j in range(1, num_stages - 1):
        for i in range(j, len(cuts)):
            for k in range(j - 1, i):
                value = max(best[j - 1][k], positions[i] - positions[k])
                if value < best[j][i]:
                    best[j][i], back[j][i] = value, k
    last = num_stages - 2
    end = min(range(last, len(cuts)), key=lambda i: (max(best[last][i], total - positions[i]), i))
    chosen = [end]
    for j in range(last, 0, -1):
        chosen.append(back[j][chosen[-1]])
    return [cuts[i][0] for i in reversed(chosen)]


def check_split_points(model: nn.Module, split_points: Sequence[str], num_stages: int) -> list[str]:
    """The user's split points, checked: each names a module of the model, once, and they make ``num_stages``."""
    if isinstance(split_points, str):
        raise ValueError(
            f'split_points must be "auto" or a list of module names, got the string {split_points!r}'
        )
    points = list(split_points)
    modules = dict(model.named_modules())
    for name in points:
        if not isinstance(name, str) or name not in modules or name == "":
            close = difflib.get_close_matches(str(name), [n for n in modules if n], n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(
                f"split point {name!r} is not a module of this {type(model).__name__}.{hint} "
                f"Split points are names from model.named_modules(), e.g. {candidate_split_points(model)[1:3]}."
            )
    if len(set(points)) != len(points):
        raise ValueError(f"split_points name a module twice: {points}")
    if len(points) != num_stages - 1:
        raise ValueError(
            f"{len(points)} split points make {len(points) + 1} stages, but the pipeline has {num_stages} "
            f"(one per process): pass {num_stages - 1} split points, or launch {len(points) + 1} processes."
        )
    return points
