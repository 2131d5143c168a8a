"""Accelerator: the few calls that make a PyTorch training loop run on any number of devices.

A thin facade over ``state`` (topology), ``data`` (sharded loaders), ``precision`` (autocast and
grad scaling), ``ops`` (collectives), ``checkpoint`` (save/load) and the training back-end chosen once in
the constructor (``self.backend``: DDP, FSDP2, DeepSpeed, the TP/CP/PP layout, XLA, ...; see
``accel_nb.accelerator.backends`` and docs/backends.md), which ``prepare``, ``backward``, ``no_sync`` and the
clipping calls ask. Everything heavy is torch's (or the back-end library's).

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(batch).loss
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..compile.options import resolve_compile_options
from ..data import DataLoaderConfiguration, prepare_data_loader
from ..data import skip_first_batches as _skip_first_batches
from ..data.random_sync import check_rng_types
from ..deepspeed.plugin import resolve_deepspeed_plugin
from ..env_names import ENV_GRADIENT_ACCUMULATION_STEPS
from ..megatron.plugin import resolve_megatron_plugin
from ..precision.fp8 import configure_fp8
from ..precision.policy import PrecisionPolicy
from ..state import AcceleratorState, GradientState
from ..topology import env_value
from ..tracking import resolve_log_with
from .backends.deepspeed import DeepSpeedBackend
from .backends.selection import choose_backend
from .device_maps import quantized_model_stays
from .model_wrapping import adopt_prepared, autocast_forward, mark_prepared
from .optim import AcceleratedOptimizer, AcceleratedScheduler
from .options import handler_options, project_configuration
from .reporting import Reporting
from .resources import Resources
from .sync_contexts import SyncContexts
from .unwrap import extract_model_from_parallel
from .views import StateViews
from .weights import ModelWeights

__all__ = ["Accelerator", "AcceleratedOptimizer", "AcceleratedScheduler"]


class Accelerator(StateViews, ModelWeights, SyncContexts, Resources, Reporting):
    """Run one training loop unchanged on a CPU, one GPU, many GPUs or many machines.

        accelerator = Accelerator(mixed_precision="fp16")
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for x, y in loader:
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()

    ``self.step`` counts ``accumulate()`` blocks since the start or the last end of a data loader
    (where it returns to 0 so every epoch starts a fresh accumulation window).

    ``rng_types`` (e.g. ``["torch", "generator"]``) copies process 0's generator states to every
    process at the start of each pass over a prepared loader. ``log_with`` ("tensorboard",
    "mlflow", "wandb", "comet_ml", "all", a GeneralTracker or a list) picks the experiment trackers that
    ``init_trackers``/``log``/``end_training`` drive on the main process (docs/tracking.md).
    ``compile=True`` or ``CompileOptions(...)`` (also the reference's ``dynamo_backend=`` /
    ``dynamo_plugin=``; default: the launch config's ``dynamo_config``) makes ``prepare`` compile
    each model with torch.compile, whole or its repeated blocks (docs/compile.md).
    ``deepspeed_plugin=DeepSpeedPlugin(...)`` (default: the launch config's ``deepspeed_config``)
    runs DeepSpeed ZeRO behind ``prepare``/``backward`` (docs/deepspeed.md).
    ``parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2)`` (default: the launch's
    ``--parallelism_config_*``) lays the processes out on a device mesh (``torch_device_mesh``):
    ``prepare`` splits models with their tensor-parallel plan and shards them with FSDP2, and
    loaders split the data over the data-parallel ranks only (docs/parallelism.md).
    ``megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, pp_degree=2)`` (default: the launch's
    ``megatron_lm_config``) builds a megatron-core GPT of the prepared model's size and returns an engine
    whose forward is a whole training step (docs/megatron.md; GPUs only).
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        split_batches: bool | None = None,
        even_batches: bool | None = None,
        device_placement: bool = True,
        step_scheduler_with_optimizer: bool = True,
        rng_types: list[str] | None = None,
        project_dir: str | None = None,
        project_config: Any = None,
        log_with: Any = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
        kwargs_handlers: list[Any] | None = None,
        gradient_accumulation_plugin: Any = None,
        compile: Any = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        fsdp: Any = None,
        fsdp_plugin: Any = None,
        deepspeed_plugin: Any = None,
        parallelism_config: Any = None,
        megatron_lm_plugin: Any = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise TypeError(
                f"Accelerator() got an unexpected keyword argument {sorted(kwargs)[0]!r}; accel_nb supports the "
                "arguments listed in help(Accelerator)"
            )
        handlers = handler_options(kwargs_handlers, gradient_accumulation_plugin, gradient_accumulation_steps)
        # DeepSpeed ZeRO: deepspeed_plugin=, else the launch environment (accel_nb.deepspeed)
        self.deepspeed_plugin = resolve_deepspeed_plugin(deepspeed_plugin)
        # Megatron-LM through megatron-core: megatron_lm_plugin=, else the launch environment (accel_nb.megatron)
        self.megatron_lm_plugin = resolve_megatron_plugin(megatron_lm_plugin)
        self.deepspeed_engine_wrapped: Any = None
        explicit_steps = gradient_accumulation_steps != 1 or gradient_accumulation_plugin is not None
        mixed_precision = DeepSpeedBackend.agree_precision(self.deepspeed_plugin, mixed_precision)
        self.state = AcceleratorState(mixed_precision=mixed_precision, cpu=cpu, **handlers.init_process_group)
        plugin = handlers.gradient_accumulation
        if plugin is not None:
            gradient_accumulation_steps = plugin.num_steps or 1
        elif gradient_accumulation_steps == 1:
            gradient_accumulation_steps = int(env_value(ENV_GRADIENT_ACCUMULATION_STEPS, "1"))
        if int(gradient_accumulation_steps) < 1:
            raise ValueError(f"gradient_accumulation_steps={gradient_accumulation_steps} must be at least 1")
        self.gradient_state = GradientState(gradient_accumulation_steps=int(gradient_accumulation_steps))
        self.gradient_state.sync_with_dataloader = plugin.sync_with_dataloader if plugin else True
        self.gradient_state.sync_each_batch = bool(plugin and plugin.sync_each_batch)
        self.profile_handler = handlers.profile  # accelerator.profile()'s settings
        # the other handlers given, under the reference's attribute names (None when not given)
        self.scaler_handler = handlers.given.get("scaler")
        self.init_handler = handlers.given.get("init_process_group")
        self.autocast_handler = handlers.given.get("autocast")
        self.precision = PrecisionPolicy(self.state.mixed_precision, self.state.device, handlers.autocast)
        self.scaler: torch.amp.GradScaler | None = self.precision.make_grad_scaler(**handlers.scaler)

        config = dataloader_config if dataloader_config is not None else DataLoaderConfiguration()
        if split_batches is not None:
            config.split_batches = split_batches
        if even_batches is not None:
            config.even_batches = even_batches
        self.dataloader_config = config
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = check_rng_types(rng_types, self.state.device)
        self.ddp_kwargs = {**handlers.ddp, **(ddp_kwargs or {})}
        self.ddp_handler = handlers.ddp_handler  # registers its communication hook on each DDP model
        self.project_configuration = project_configuration(project_dir, project_config)
        self.log_with = resolve_log_with(log_with, getattr(self.project_configuration, "logging_dir", None))
        # torch.compile for prepared models: compile=/dynamo_backend=/dynamo_plugin=, else the launch config
        self.compile_options = resolve_compile_options(compile, dynamo_backend, dynamo_plugin)
        # the training back-end (accel_nb.accelerator.backends), chosen once: DeepSpeed, the parallelism
        # layout, FSDP2, XLA or DDP; it sets fsdp_options, parallel_layout and state.distributed_type
        self.fsdp_options: Any = None
        self.parallel_layout: Any = None
        # FP8 (accel_nb.precision.fp8): the recipe, its refusals and the reference's fp8_* attributes; prepare
        # converts each model's linear layers through the registered conversion (backends/fp8.py)
        self.fp8 = configure_fp8(self, handlers.fp8_recipe)
        self.backend = choose_backend(self, fsdp, fsdp_plugin, parallelism_config, explicit_steps)

        # everything prepare() produced, in order; the checkpoint module saves and restores these
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[DataLoader] = []
        self._custom_objects: list[Any] = []
        self._prepared_lists: dict[str, list[Any]] = {
            "model": self._models,
            "optimizer": self._optimizers,
            "scheduler": self._schedulers,
            "dataloader": self._dataloaders,
        }
        self.step = 0
        self.trackers: list[Any] = []
        self._tracking_started = False  # init_trackers ran (on every process)

    # -- prepare -------------------------------------------------------------------------------------
    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.backend.relink(self)  # it holds this Accelerator weakly, and weak references do not pickle

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers; returns them in the same order.

        Anything else is returned unchanged, and so is an object prepare() already returned (a
        rerun notebook cell). Models are prepared first, then optimizers, loaders and finally
        schedulers (which need the prepared optimizers).

            model, opt, loader = accelerator.prepare(model, opt, loader)
        """
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one per object"
            )
        result = self.backend.prepare(args, device_placement)
        return result[0] if len(result) == 1 else tuple(result)

    # -- what prepare() made: one public record, read by checkpoints and free_memory -------------------
    def register_prepared(self, obj: Any, kind: str) -> Any:
        """Record ``obj`` as a prepared ``kind`` ("model", "optimizer", "scheduler" or "dataloader"), in order,
        and mark it as something ``prepare`` returned; returns ``obj``. Back-ends that build their own
        wrappers (DeepSpeed's engine) register them here."""
        self._prepared_lists[kind].append(obj)
        return mark_prepared(obj)

    def already_prepared(self, obj: Any, kind: str) -> bool:
        """True when ``obj`` is something ``prepare`` returned (a rerun cell): it is recorded here if it was not."""
        return adopt_prepared(obj, self._prepared_lists[kind])

    def prepared(self, kind: str) -> list[Any]:
        """The prepared objects of ``kind`` in the order ``prepare`` made them (the list itself)."""
        return self._prepared_lists[kind]

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Move ``model`` to the device, run its forward under autocast, wrap it in DDP when distributed.

        A model ``prepare`` returned comes back as it is (rerunning a notebook cell); the model
        inside a DDP wrapper prepare() made is an error (it would be wrapped twice).
        """
        if self.already_prepared(model, "model"):
            return model
        self.backend.refuse_rewrap(model)
        if device_placement is None:
            device_placement = self.device_placement
        backend = self.backend
        device_map = getattr(model, "hf_device_map", None)
        if device_map and len(set(device_map.values())) > 1:
            if self.use_distributed:
                raise ValueError(
                    "this model is dispatched over several devices (hf_device_map) and cannot be trained with "
                    f"{self.num_processes} processes; load it on one device per process, or use one process"
                )
            device_placement = False  # its layers already sit where the device map put them
        if quantized_model_stays(model, self.device):
            device_placement = False  # bitsandbytes layers stay where loading put them, as in the reference
        if device_placement:
            model = backend.place(model)
        for conversion in self.conversions:  # precisions that change layers (FP8), before any wrapper
            model = conversion.convert(self, model)
        model = autocast_forward(model, self.precision)
        # compiled inside DDP's wrapper, around the autocast forward; FSDP: in place
        if self.compile_options is not None:
            from ..compile.apply import compile_model

            model = compile_model(model, self.compile_options, in_place=backend.compiles_in_place())
        model = backend.wrap(model, evaluation_mode)
        backend.after_model(model)
        return self.register_prepared(model, "model")

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` so it steps on sync steps only, through the grad scaler in fp16."""
        if self.already_prepared(optimizer, "optimizer"):
            return optimizer
        if device_placement is None:
            device_placement = self.device_placement
        self.backend.adopt_optimizer(optimizer)  # the parameters prepare made of the models prepared before
        prepared = AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=self.scaler)
        return self.register_prepared(prepared, "optimizer")

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap an LR scheduler so it follows the real optimizer steps."""
        if self.already_prepared(scheduler, "scheduler"):
            return scheduler
        target = getattr(scheduler, "optimizer", None)
        optimizers = [opt for opt in self._optimizers if opt.optimizer is target or opt is target] or list(
            self._optimizers
        )
        accelerated = AcceleratedScheduler(
            scheduler,
            optimizers,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            num_processes=self.num_processes,
        )
        return self.register_prepared(accelerated, "scheduler")

    def prepare_data_loader(
        self, data_loader: DataLoader, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> DataLoader:
        """Shard ``data_loader`` over the processes and place its batches on the device
        (``slice_fn_for_dispatch``: how a dispatched round is cut, as in the reference)."""
        if self.already_prepared(data_loader, "dataloader"):
            return data_loader
        if device_placement is None:
            device_placement = self.device_placement
        cfg = self.dataloader_config
        self.backend.check_dispatch(cfg.dispatch_batches)
        num_shards, shard = (
            self.backend.data_shards()
        )  # a tensor/context-parallel group reads the same batches
        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=num_shards,
            process_index=shard,
            split_batches=cfg.split_batches,
            even_batches=cfg.even_batches,
            put_on_device=device_placement,
            use_seedable_sampler=cfg.use_seedable_sampler,
            data_seed=cfg.data_seed,
            non_blocking=cfg.non_blocking,
            rng_types=self.rng_types,
            dispatch_batches=cfg.dispatch_batches,
            use_stateful_dataloader=cfg.use_stateful_dataloader,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
        )
        return self.register_prepared(prepared, "dataloader")

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        """A loader like ``dataloader`` that starts after its first ``num_batches`` batches."""
        return _skip_first_batches(dataloader, num_batches)

    # -- the training step ---------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled in fp16.

        Works on any loss tensor: gradients are synchronised only for models that went through
        ``prepare`` (DDP), everything else is plain autograd.
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"backward() needs the loss tensor, got {type(loss).__name__}; pass the tensor your loss "
                "function returned (not loss.item())"
            )
        self.backend.backward(loss, **kwargs)

    def autocast(self, autocast_handler: Any = None, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of this run's mixed precision (nothing for ``no``); an
        ``AutocastKwargs`` given here replaces the Accelerator's for this block."""
        if autocast_handler is not None:
            handler_options([autocast_handler])  # checks it is an AutocastKwargs; all its fields apply
            kwargs = {**{k: v for k, v in autocast_handler.to_dict().items() if v is not None}, **kwargs}
        return self.precision.autocast(**kwargs)

    def _do_sync(self) -> None:
        gs = self.gradient_state
        if gs.sync_with_dataloader and gs.end_of_dataloader:
            self.step = 0
            gs._set_sync_gradients(True)
        else:
            self.step += 1
            gs._set_sync_gradients(self.step % gs.num_steps == 0)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Accumulate gradients: sync and step every ``gradient_accumulation_steps`` blocks.

        Inside the block ``sync_gradients`` says whether this is an updating step; DDP
        communication is skipped (``no_sync``) on the other steps. The last batch of a prepared
        data loader always syncs.
        """
        self._do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.sync_gradients or getattr(self.gradient_state, "sync_each_batch", False)):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip DDP's gradient all-reduce for the backward passes inside (nothing with one process)."""
        return self.backend.no_sync(model)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide fp16 gradients by the loss scale (before clipping or inspecting them)."""
        if self.scaler is None:
            return
        optimizers = (
            self._optimizers
            if optimizer is None
            else (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
        )
        for opt in optimizers:
            self.scaler.unscale_(opt.optimizer if isinstance(opt, AcceleratedOptimizer) else opt)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor | None:
        """``torch.nn.utils.clip_grad_norm_`` after unscaling fp16 gradients; returns the total norm.

        With fp16 it returns None on accumulation steps (the gradients are partial and still scaled);
        so it does with FSDP (each rank holds its own unreduced gradients until the sync step).
        With DeepSpeed the engine clipped in its step (config ``gradient_clipping``): its norm is returned.
        """
        return self.backend.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """``torch.nn.utils.clip_grad_value_`` after unscaling fp16 gradients (sync steps only with fp16 or FSDP)."""
        self.backend.clip_grad_value_(parameters, clip_value)

    # -- models --------------------------------------------------------------------------------------
    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's model inside the DDP wrapper (without the autocast forward if asked; the
        compiled module around it unless ``keep_torch_compile=False``)."""
        return extract_model_from_parallel(model, keep_fp32_wrapper, keep_torch_compile)

    # -- checkpointing (implemented in accel_nb.checkpoint) -------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save/restore ``objects`` (anything with state_dict/load_state_dict) with save_state/load_state."""
        from ..checkpoint import checkpointable

        self._custom_objects.extend(checkpointable(objects))

    def save_state(self, output_dir: str | None = None, **kwargs: Any) -> Any:
        """Save models, optimizers, schedulers, scaler, RNG states, loader positions and registered objects."""
        from ..checkpoint import save_accelerator_state

        return save_accelerator_state(self, output_dir, **kwargs)

    def load_state(self, input_dir: str | None = None, **kwargs: Any) -> Any:
        """Restore what :meth:`save_state` saved (the latest checkpoint of the project by default)."""
        from ..checkpoint import load_accelerator_state

        return load_accelerator_state(self, input_dir, **kwargs)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> Any:
        """Save the unwrapped model's weights (sharded safetensors + index) on the main process."""
        from .. import checkpoint

        return checkpoint.save_model(self, model, save_directory, max_shard_size, safe_serialization)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors for a dict of tensors) on the main process only, atomically.

            accelerator.save(unwrapped.state_dict(), "weights.pt")

        The other processes return at once without writing.
        """
        from ..checkpoint import save_object

        save_object(self, obj, f, safe_serialization)

    def __repr__(self) -> str:
        return (
            f"Accelerator(num_processes={self.num_processes}, device={self.device}, "
            f"mixed_precision={self.mixed_precision!r}, gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )
