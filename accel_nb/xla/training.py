"""The training step on XLA devices: gradients all-reduced in the optimizer step, the step's graph launched.

There is no DDP wrapper on XLA devices: ``AcceleratedOptimizer.step`` calls
:func:`optimizer_step`, which averages the gradients over every device (``xm.reduce_gradients``),
steps, and compiles and launches the step's graph under the graph lock. ``Accelerator.clip_grad_norm_``
calls :func:`reduce_before_clipping` first, so the norm is the one of the averaged gradients (as
with DDP); the step then does not reduce them a second time.

    optimizer_step(accelerated_optimizer, closure=None)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from . import runtime

__all__ = ["optimizer_step", "reduce_gradients", "reduce_before_clipping", "tensors_to_cpu", "host_copy"]

_REDUCED = "_accel_nb_xla_gradients_reduced"  # set on an AcceleratedOptimizer whose gradients are averaged


def _launch_step() -> None:
    """Compile and launch the pending graph (it may hold a collective), then meet the other device threads."""
    runtime.sync()
    runtime.devices_meet()


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average the gradients of ``optimizer``'s parameters over every XLA device (traced; on TPUs launched with the step).

    With devices as threads each device's forward/backward runs first on its own, then the
    all-reduce runs alone (``runtime.run_collective``): the same program on every device, finished
    before the update is traced.
    """
    import torch_xla.core.xla_model as xm

    world = runtime.world_size()
    if world == 1:
        return
    if runtime.devices_are_threads():
        _launch_step()
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    # one all-reduce per dtype over the flattened gradients (xm.reduce_gradients' in-place list
    # all-reduce crashed on XLA's CPU backend with devices as threads); traced under the graph lock
    with runtime.graph_lock(), torch.no_grad():
        for grads in by_dtype.values():
            total = xm.all_reduce(xm.REDUCE_SUM, torch.cat([g.reshape(-1) for g in grads]))
            offset = 0
            for g in grads:
                g.copy_(total[offset : offset + g.numel()].view_as(g) / world)
                offset += g.numel()
    if runtime.devices_are_threads():  # the all-reduce's graph alone, waited for before the update is traced
        runtime.run_collective([g for grads in by_dtype.values() for g in grads])


def optimizer_step(accelerated: Any, closure: Any = None) -> Any:
    """``accelerated.optimizer.step()`` with gradients averaged over the devices, the step's graph launched."""
    if not getattr(accelerated, _REDUCED, False):
        reduce_gradients(accelerated.optimizer)
    setattr(accelerated, _REDUCED, False)
    inner = accelerated.optimizer
    result = inner.step(closure) if closure is not None else inner.step()
    _launch_step()
    return result


def reduce_before_clipping(optimizers: Iterable[Any]) -> None:
    """Average the gradients of the prepared ``optimizers`` now (on a sync step, on XLA devices only)."""
    if not runtime.in_use():
        return
    for opt in optimizers:
        if not getattr(opt, "gradient_state", None) or not opt.gradient_state.sync_gradients:
            continue
        if not getattr(opt, _REDUCED, False):
            reduce_gradients(opt.optimizer)
            setattr(opt, _REDUCED, True)


def tensors_to_cpu(obj: Any) -> Any:
    """``obj`` with every XLA tensor (in dicts, lists, tuples) replaced by a CPU copy; the rest unchanged.

    Checkpoints written on XLA devices then load anywhere (``xm.save``'s rule, our file formats).
    """
    if isinstance(obj, torch.Tensor):
        return obj.cpu() if obj.device.type == "xla" else obj
    if isinstance(obj, dict):
        out = obj.copy()  # an OrderedDict state dict stays one, with its _metadata
        for k, v in obj.items():
            out[k] = tensors_to_cpu(v)
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if isinstance(obj, list):
        return [tensors_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        items = [tensors_to_cpu(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def host_copy(obj: Any) -> Any:
    """``obj`` ready to be written by a checkpoint: XLA tensors copied to the CPU (on XLA devices only).

    host_copy(model.state_dict())   # the same dict outside XLA runs
    """
    return tensors_to_cpu(obj) if runtime.in_use() else obj


def parameter_slots(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Parameter]]:
    """Every (module, name, parameter) of ``model``, taken before ``model.to(xla_device)``."""
    return [(m, name, p) for m in model.modules() for name, p in m._parameters.items() if p is not None]


def parameter_swap(before: list[tuple[torch.nn.Module, str, torch.nn.Parameter]]) -> dict[int, Any]:
    """What each parameter of ``before`` became: moving a module to an XLA device makes new Parameter
    objects, so an optimizer built on the CPU model must be re-pointed (``fsdp.sharding.repoint_optimizer``'s form).
    """
    import weakref

    swap: dict[int, Any] = {}
    for module, name, old in before:
        new = module._parameters.get(name)
        if new is not None and new is not old:
            swap[id(old)] = (weakref.ref(old), weakref.ref(new))
    return swap
