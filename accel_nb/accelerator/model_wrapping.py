"""What ``Accelerator.prepare`` does to every object whatever the back-end: the "prepared" mark, and a
model's autocast forward.

A prepared model is placed by the training back-end (``accel_nb.accelerator.backends``), runs its forward
under the run's autocast (outputs back in fp32), and is wrapped by the back-end (DDP, FSDP2, ...).
``Accelerator.unwrap_model`` undoes it with ``accel_nb.accelerator.unwrap.extract_model_from_parallel``.
Nothing here keeps state: the Accelerator remembers what it prepared (``register_prepared``).

    model = autocast_forward(model, policy)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["adopt_prepared", "autocast_forward", "mark_prepared"]

_PREPARED = "_accel_nb_prepared"  # set on every object Accelerator.prepare() returns
# the reference's name for the same mark: code written for it reads it (and sets it to skip prepare)
_REFERENCE_PREPARED = "_is_accelerate_prepared"


def mark_prepared(obj: Any) -> Any:
    """``obj``, marked as something ``Accelerator.prepare`` returned (under both libraries' names)."""
    setattr(obj, _PREPARED, True)
    setattr(obj, _REFERENCE_PREPARED, True)
    return obj


def adopt_prepared(obj: Any, prepared: list[Any]) -> bool:
    """True when ``obj`` is already prepared (so it is used as it is), adding it to ``prepared`` if absent.

    Rerunning a notebook cell ``model = accelerator.prepare(model)`` passes the prepared model
    again, possibly to a new Accelerator: it is tracked (checkpoints, ``free_memory``) and returned.
    """
    if not (getattr(obj, _PREPARED, False) or getattr(obj, _REFERENCE_PREPARED, False)):
        return False
    if not any(obj is seen for seen in prepared):
        prepared.append(obj)
    return True


def autocast_forward(model: torch.nn.Module, precision: Any) -> torch.nn.Module:
    """``model`` whose forward runs under ``precision``'s autocast (outputs back in fp32); as it is without
    mixed precision, or when prepare already did it."""
    if precision.enabled and not getattr(model.forward, "_accel_nb_autocast", False):
        model._accel_nb_original_forward = model.forward
        model.forward = precision.wrap_forward(model.forward)
    return model
