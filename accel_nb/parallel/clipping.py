"""Gradient-norm clipping when gradients live on several meshes: tensor-parallel weights on
``dp_shard × tp``, norms only on ``dp_shard``, plain tensors on every rank.

    norm = clip_grad_norm_across_meshes(model.parameters(), max_norm=1.0)   # the global norm (a plain tensor)

Each group's norm is reduced over its own mesh (``full_tensor``), the groups' norms combined, and
every gradient scaled by the same factor, as ``torch.nn.utils.clip_grad_norm_`` does for one group.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["clip_grad_norm_across_meshes"]


def clip_grad_norm_across_meshes(parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip the gradients of ``parameters`` to a global norm of ``max_norm``; returns the norm before clipping."""
    from torch.distributed.tensor import DTensor  # deferred: torch.distributed

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm_type = float(norm_type)
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    norms = []
    for key, members in groups.items():
        norm = torch.nn.utils.get_total_norm(members, norm_type)
        if key is not None:
            norm = norm.full_tensor()  # reduced over the group's mesh (a sum of powers, or a max)
        norms.append(norm.float())
    if math.isinf(norm_type):
        total = torch.stack(norms).max()
    else:
        total = torch.stack(norms).pow(norm_type).sum().pow(1.0 / norm_type)
    coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
