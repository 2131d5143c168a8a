"""The Accelerator's less common calls: state dicts, checkpoint pre-hooks, DDP contexts, profiling.

Kept apart from ``accelerator.py`` (the training core) and mixed into ``Accelerator``; each has
the reference library's name, arguments and meaning.

    state = accelerator.get_state_dict(model)            # the plain model's weights
    handle = accelerator.register_save_state_pre_hook(lambda models, weights, folder: ...)
    with accelerator.join_uneven_inputs([model], even_batches=False): ...
    with accelerator.profile() as prof: ...
"""

from __future__ import annotations

import collections
import contextlib
import gc
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

__all__ = ["AcceleratorExtras", "run_save_hooks", "run_load_hooks"]


def _hooks(accelerator: Any, kind: str) -> collections.OrderedDict:
    name = f"_{kind}_state_pre_hooks"
    table = accelerator.__dict__.get(name)
    if table is None:
        table = accelerator.__dict__[name] = collections.OrderedDict()
    return table


def run_save_hooks(accelerator: Any, models: list[Any], weights: list[dict[str, Any]], folder: str) -> None:
    """Call every save pre-hook with (models, weights, folder); they may pop what they save themselves."""
    for hook in list(_hooks(accelerator, "save").values()):
        hook(models, weights, folder)


def run_load_hooks(accelerator: Any, models: list[Any], folder: str) -> None:
    """Call every load pre-hook with (models, folder); they may pop the models they load themselves."""
    for hook in list(_hooks(accelerator, "load").values()):
        hook(models, folder)


def _shard_sampler(loader: Any) -> Any:
    """The batch sampler that shards ``loader`` over the processes (the one with ``even_batches``), or None."""
    sampler = getattr(loader, "batch_sampler", None)
    while sampler is not None and not hasattr(sampler, "even_batches"):
        sampler = getattr(sampler, "batch_sampler", None)
    return sampler


class AcceleratorExtras:
    """``get_state_dict``, the save/load pre-hooks, ``trigger_sync_in_backward``, ``join_uneven_inputs``,
    ``profile``, ``free_memory``."""

    _models: list[Any]
    _optimizers: list[Any]
    _schedulers: list[Any]
    _dataloaders: list[Any]
    _custom_objects: list[Any]
    profile_handler: Any = None

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop every prepared object's reference here, collect garbage and empty the CUDA cache.

            model, optimizer = accelerator.free_memory(model, optimizer)
        """
        for prepared in (self._models, self._optimizers, self._schedulers, self._dataloaders, self._custom_objects):
            prepared.clear()
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def clear(self, *objects: Any) -> list[None]:
        """The same as :meth:`free_memory`."""
        return self.free_memory(*objects)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The state dict of a prepared model: of the user's model inside (``unwrap=True``) or of the wrapper.

            weights = accelerator.get_state_dict(model)       # keys as in the plain model
        """
        if getattr(self, "deepspeed_plugin", None) is not None:  # every rank: ZeRO-3 shards gathered on the main one
            from .deepspeed.training import engine_state_dict

            state = engine_state_dict(self, model)
            if state is not None:
                return state
        if unwrap:
            model = self.unwrap_model(model)  # type: ignore[attr-defined]
        from .fsdp.sharding import is_fsdp_model

        if is_fsdp_model(model):  # gathered from every rank (call it on all): the full weights on the main process
            from .fsdp.state_dicts import full_model_state

            return full_model_state(model)
        return model.state_dict()

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in every ``save_state`` before the weights are written.

        ``weights`` holds the state dict of each prepared model (unwrapped); a hook that saves a
        model its own way pops its entry so ``save_state`` skips it. Returns a handle:
        ``handle.remove()`` unregisters the hook.

            def save_hook(models, weights, output_dir):
                for model in models:
                    torch.save(model.config, f"{output_dir}/config.pt")
            handle = accelerator.register_save_state_pre_hook(save_hook)
        """
        table = _hooks(self, "save")
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in every ``load_state`` before the weights are read.

        A hook that loads a model its own way pops it from ``models`` so ``load_state`` skips it
        (pair it with a save hook that popped the same entry). Returns a removable handle.

            handle = accelerator.register_load_state_pre_hook(lambda models, input_dir: None)
        """
        table = _hooks(self, "load")
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle

    @staticmethod
    @contextlib.contextmanager
    def trigger_sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward of a DDP model all-reduce its gradients, even after ``no_sync`` forwards.

            with accelerator.no_sync(model):
                loss_a = loss_fn(model(a))
            accelerator.backward(loss_a)                  # not synchronised
            with accelerator.trigger_sync_in_backward(model):
                accelerator.backward(loss_fn(model(b)))   # synchronised, with loss_a's gradients

        Nothing happens for a model that is not wrapped in DDP (one process).
        """
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

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[Any]:
        """torch's ``Join`` around a loop whose processes get different numbers of batches.

        ``even_batches`` overrides the Accelerator's setting for the prepared loaders inside the
        block; with even batches every process has the same count and ``Join`` is not needed
        (disabled). With one process it does nothing.

            with accelerator.join_uneven_inputs([model], even_batches=False):
                for x, y in loader:
                    accelerator.backward(loss_fn(model(x), y)); optimizer.step(); optimizer.zero_grad()
        """
        if not self.use_distributed:  # type: ignore[attr-defined]
            yield joinables
            return
        from torch.distributed.algorithms.join import Join

        restore: list[tuple[Any, bool]] = []
        if even_batches is not None:
            iterable_seen = False
            for loader in self._dataloaders:
                sampler = _shard_sampler(loader)
                if sampler is None:
                    iterable_seen = True
                    continue
                restore.append((sampler, sampler.even_batches))
                sampler.even_batches = even_batches
            if iterable_seen:
                warnings.warn(
                    "join_uneven_inputs(even_batches=...) changes map-style loaders only; the iterable-dataset "
                    "loaders keep their setting",
                    UserWarning,
                    stacklevel=3,
                )
        else:
            even_batches = self.even_batches  # type: ignore[attr-defined]
        try:
            with Join(joinables, enable=not even_batches, throw_on_early_termination=False):
                yield joinables
        finally:
            for sampler, value in restore:
                sampler.even_batches = value

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None) -> Iterator[Any]:
        """Profile the block with torch's profiler (settings from ``ProfileKwargs``); yields the profiler.

        With ``output_trace_dir`` set, each process writes ``profile_<process_index>.json`` (a
        Chrome trace) there at the end, then waits for the others.

            with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir="traces")) as prof:
                train_step()
            accelerator.print(prof.key_averages().table(row_limit=10))
        """
        from .kwargs_handlers import profile_context, read_kwargs_handlers

        handler = profile_handler or self.profile_handler
        if handler is not None:
            handler = read_kwargs_handlers([handler]).profile  # the reference's instances too
        with profile_context(handler, process_index=self.process_index) as prof:  # type: ignore[attr-defined]
            yield prof
        if handler is not None and handler.output_trace_dir:
            self.wait_for_everyone()  # type: ignore[attr-defined]
