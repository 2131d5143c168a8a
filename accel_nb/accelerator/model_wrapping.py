"""What ``Accelerator.prepare`` does to a model.

``Accelerator.unwrap_model`` undoes it with ``accel_nb.accelerator.unwrap.extract_model_from_parallel``.
A prepared model is moved to the process's device, runs its forward under the run's autocast
(outputs back in fp32), and is wrapped in ``DistributedDataParallel`` when several processes
train it. Nothing here keeps state: the Accelerator remembers what it prepared.

    model = place_and_wrap(model, device, policy, distributed=True, ddp_kwargs={})
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["adopt_prepared", "mark_prepared", "place_and_wrap"]

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


def place_and_wrap(
    model: torch.nn.Module,
    device: torch.device,
    precision: Any,
    distributed: bool,
    num_processes: int,
    ddp_kwargs: dict[str, Any],
    device_placement: bool,
    evaluation_mode: bool = False,
    compile_options: Any = None,
    fsdp: Any = None,
    fsdp_swap: dict[int, Any] | None = None,
    local_processes: int = 1,
    parallel: Any = None,
) -> torch.nn.Module:
    """``model`` on ``device``, with the autocast forward of ``precision``, in DDP when ``distributed``.

    With ``fsdp`` (an ``FSDPOptions``) the model is sharded in place with torch's ``fully_shard``
    instead of DDP (even in evaluation mode: sharding is about memory); ``fsdp_swap`` receives what
    each original parameter became, for the optimizer (accel_nb.fsdp.sharding).

    A model dispatched over several devices (``hf_device_map``) stays where it is, and cannot be
    trained by several processes (a clear error). ``compile_options`` (a CompileOptions) compiles
    it before the DDP wrapping, as torch recommends (accel_nb.compile.apply).

    ``parallel`` (an ``accel_nb.parallel.preparing.ParallelLayout``) splits the model with its
    tensor-parallel plan and shards it with FSDP2 over the layout's mesh instead of ``fsdp``/DDP.
    """
    by_layout = parallel is not None and (parallel.tp_enabled or parallel.fsdp is not None)
    if by_layout:
        fsdp = parallel.fsdp  # sharded below, over the layout's mesh
    device_map = getattr(model, "hf_device_map", None)
    if device_map and len(set(device_map.values())) > 1:
        if distributed:
            raise ValueError(
                "this model is dispatched over several devices (hf_device_map) and cannot be trained with "
                f"{num_processes} processes; load it on one device per process, or use one process"
            )
        device_placement = False  # its layers already sit where the device map put them
    if device_placement and fsdp is None:  # fully_shard moves each unit itself: never the whole model at once
        before = None
        if device.type == "xla":  # .to() makes new Parameter objects there: optimizers must follow them
            from ..xla.training import parameter_slots

            before = parameter_slots(model)
        model = model.to(device)
        if before is not None and fsdp_swap is not None:
            from ..xla.training import parameter_swap

            fsdp_swap.update(parameter_swap(before))
    if precision.enabled and not getattr(model.forward, "_accel_nb_autocast", False):
        model._accel_nb_original_forward = model.forward
        model.forward = precision.wrap_forward(model.forward)
    if compile_options is not None:  # inside DDP's wrapper, around the autocast forward; FSDP: in place
        from ..compile.apply import compile_model

        # in place under FSDP or a parallelism layout: the plan and fully_shard see the model's own names
        model = compile_model(model, compile_options, in_place=fsdp is not None or by_layout)
    if by_layout:
        from ..parallel.preparing import parallelize  # deferred: torch.distributed.tensor

        swap = parallelize(model, parallel, precision.mixed_precision, device)
        if fsdp_swap is not None:
            fsdp_swap.update(swap)
    elif fsdp is not None:
        from ..fsdp.sharding import shard_model

        swap = shard_model(model, fsdp, precision.mixed_precision, device, num_processes, local_processes)
        if fsdp_swap is not None:
            fsdp_swap.update(swap)
    # no DDP on XLA devices: the prepared optimizer all-reduces the gradients (accel_nb.xla.training)
    elif (
        distributed
        and device.type != "xla"
        and not evaluation_mode
        and any(p.requires_grad for p in model.parameters())
    ):
        kwargs = dict(ddp_kwargs)
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        model = DistributedDataParallel(model, **kwargs)
    return model
