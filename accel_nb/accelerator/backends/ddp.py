"""The plain back-end: one process, or one copy of the model per process in torch's DistributedDataParallel.

``launch_types``: NO, MULTI_CPU, MULTI_GPU and the reference's other MULTI_* values (any type no other
back-end claims). DDP all-reduces gradients in ``backward``; ``no_sync`` skips that on accumulation steps.

    backend = DdpBackend(accelerator)
    model = backend.wrap(model, evaluation_mode=False)     # DDP(model) with several processes
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .base import TrainingBackend, register_backend

if TYPE_CHECKING:
    import torch

__all__ = ["DdpBackend", "ddp_wrapper_of", "sync_in_backward"]


def ddp_wrapper_of(model: Any, prepared: list[Any]) -> Any:
    """The DistributedDataParallel wrapper of ``model``: itself, the one inside torch.compile, or the one
    ``prepare`` made around it (found in ``prepared``); None when there is none."""
    from torch.nn.parallel import DistributedDataParallel

    from ..unwrap import is_compiled_module

    if is_compiled_module(model):  # torch.compile(DDP(...)): the DDP wrapper inside
        model = model._orig_mod
    if isinstance(model, DistributedDataParallel):
        return model
    # the user may hold the inner module: find the DDP wrapper prepare() made for it
    wrappers = (m._orig_mod if is_compiled_module(m) else m for m in prepared)
    return next((m for m in wrappers if isinstance(m, DistributedDataParallel) and m.module is model), None)


@contextlib.contextmanager
def sync_in_backward(model: Any) -> Iterator[None]:
    """``Accelerator.trigger_sync_in_backward``: the next backward of a DDP model (compiled or not) all-reduces
    its gradients, even after ``no_sync`` forwards; nothing for a model not wrapped in DDP."""
    from torch.nn.parallel import DistributedDataParallel

    model = getattr(model, "_orig_mod", model)  # a compiled DDP model: the DDP wrapper inside
    if not isinstance(model, DistributedDataParallel):
        yield
        return
    saved = model.require_backward_grad_sync, model.require_forward_param_sync
    model.require_backward_grad_sync = True
    model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])  # the reducer expects every parameter's gradient
    try:
        yield
    finally:
        model.require_backward_grad_sync, model.require_forward_param_sync = saved


@register_backend
class DdpBackend(TrainingBackend):
    """Data parallel with DDP (with one process: the model as it is)."""

    name = "ddp"
    launch_types = ("NO", "MULTI_CPU", "MULTI_GPU")

    def refuse_rewrap(self, model: torch.nn.Module) -> None:
        from torch.nn.parallel import DistributedDataParallel

        acc = self.accelerator
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        if any(
            inner is acc.unwrap_model(m, keep_torch_compile=False) for m in acc.prepared("model")
        ) or isinstance(model, DistributedDataParallel):
            raise ValueError(
                f"this {type(inner).__name__} was already prepared and wrapped; pass the object that prepare() "
                "returned (it is given back as it is)"
            )

    def wrap(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """DDP around ``model`` when several processes train it (not in evaluation mode, not without trainable parameters)."""
        acc = self.accelerator
        if not (
            acc.use_distributed and not evaluation_mode and any(p.requires_grad for p in model.parameters())
        ):
            return model
        from torch.nn.parallel import DistributedDataParallel

        kwargs = dict(acc.ddp_kwargs)
        device = acc.device
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        return DistributedDataParallel(model, **kwargs)

    def after_model(self, model: torch.nn.Module) -> None:
        """Register the DDP communication hook of the run's ``DistributedDataParallelKwargs`` on the new wrapper."""
        from torch.nn.parallel import DistributedDataParallel

        from ..unwrap import is_compiled_module

        handler = self.accelerator.ddp_handler
        ddp = model._orig_mod if is_compiled_module(model) else model  # torch.compile(DDP(...)) seen through
        if isinstance(ddp, DistributedDataParallel) and handler is not None:
            handler.register_comm_hook(ddp)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` (found through torch.compile and for the inner module too); nothing otherwise."""
        ddp = ddp_wrapper_of(model, self.accelerator.prepared("model"))
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()
