"""``prepare`` under DeepSpeed: fill the config's ``"auto"`` values, call ``deepspeed.initialize`` once
for the model, its optimizer and scheduler, and hand back the engine and the wrappers.

    model, optimizer, loader, scheduler = prepare_deepspeed(accelerator, (model, optimizer, loader, scheduler))
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import sys
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..accelerator.optim import AcceleratedScheduler, is_lr_scheduler
from ..logging import quiet_import_notes
from .plugin import AUTO, EXTRA_HINT, DeepSpeedPlugin, get_value
from .wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)

__all__ = ["import_deepspeed", "prepare_deepspeed", "filled_config", "agree_accumulation", "zero3_init"]


def import_deepspeed(device_type: str) -> Any:
    """``import deepspeed`` for a run on ``device_type`` ("cpu" or "cuda"), or a clear error.

    On CPU it selects DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) before the import and
    keeps its collectives on the gloo process group, so nothing is compiled at run time.
    """
    if device_type == "cpu" and "deepspeed" not in sys.modules:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        with quiet_import_notes():
            import deepspeed
            from deepspeed.accelerator import get_accelerator
    except ImportError as exc:
        raise ImportError(
            f"DeepSpeed was asked for (deepspeed_plugin / distributed_type DEEPSPEED) but "
            f"`import deepspeed` failed ({exc}); {EXTRA_HINT}"
        ) from exc
    chosen = get_accelerator().device_name()
    wanted = "cpu" if device_type == "cpu" else device_type
    if chosen != wanted:
        raise RuntimeError(
            f"DeepSpeed runs on its {chosen!r} accelerator in this process but the Accelerator's device is "
            f"{device_type!r}; set DS_ACCELERATOR={wanted} before anything imports deepspeed (or restart the kernel)"
        )
    if chosen == "cpu":  # the shared-memory allreduce op would be compiled at the first initialize (minutes)
        with contextlib.suppress(Exception):
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    quiet_deepspeed_deprecations()
    return deepspeed


# torch's FutureWarnings for collectives DeepSpeed's ZeRO calls every step; DeepSpeed also changes the
# warning filters every step, which resets Python's "once per place" memory, so each step printed them
# again on every rank (the user can do nothing about either)
DEEPSPEED_DEPRECATIONS = (
    r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
    r"`torch\.distributed\.reduce_scatter_tensor` is deprecated",
)


def quiet_deepspeed_deprecations() -> None:
    """Ignore ``DEEPSPEED_DEPRECATIONS`` in this process (once; a user's own filters added later still win)."""
    for message in DEEPSPEED_DEPRECATIONS:
        if not any(
            f[0] == "ignore" and f[1] is not None and f[1].pattern == message for f in warnings.filters
        ):
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_process_group(deepspeed: Any, device_type: str) -> None:
    """DeepSpeed needs a process group even for one process: open a one-rank group then."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())  # adopts the existing group
        return
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    deepspeed.init_distributed(
        dist_backend="gloo" if device_type == "cpu" else "nccl", auto_mpi_discovery=False
    )


def agree_accumulation(plugin: DeepSpeedPlugin, steps: int, explicit: bool) -> int:
    """The accumulation steps the Accelerator and the engine both use; an error when they disagree.

    The config's number wins over the Accelerator's default of 1; an explicit different number is refused.
    """
    configured = plugin.deepspeed_config.get("gradient_accumulation_steps")
    if configured in (None, AUTO):
        plugin.deepspeed_config["gradient_accumulation_steps"] = steps
        return steps
    if explicit and int(configured) != steps:
        raise ValueError(
            f"gradient_accumulation_steps={steps} disagrees with the DeepSpeed config's {configured}; set one of "
            "them, or set the config's value to 'auto'"
        )
    return int(configured)


def _micro_batch(accelerator: Any, plugin: DeepSpeedPlugin, loaders: list[Any]) -> int:
    if not plugin.is_auto("train_micro_batch_size_per_gpu") and plugin.get_value(
        "train_micro_batch_size_per_gpu"
    ):
        return int(plugin.get_value("train_micro_batch_size_per_gpu"))
    sizes = [getattr(dl, "batch_size", None) for dl in loaders]
    if not sizes or any(size is None for size in sizes):
        raise ValueError(
            "DeepSpeed needs the batch size per process: pass the training DataLoader (with an integer batch_size) "
            "to the same prepare() call as the model, or set train_micro_batch_size_per_gpu in the DeepSpeed config"
        )
    if accelerator.split_batches:
        sizes = [size // accelerator.num_processes for size in sizes]
    return min(sizes) if plugin.is_train_batch_min else max(sizes)


def _hidden_size(model: torch.nn.Module, keys: list[str]) -> int:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    if size is None and getattr(config, "hidden_sizes", None):
        size = max(config.hidden_sizes)
    if size is None:
        raise ValueError(
            f"the DeepSpeed config has 'auto' for {', '.join(keys)}, which are filled from model.config.hidden_size, "
            f"and this {type(model).__name__} has none; give those keys numbers in the config"
        )
    return int(size)


def filled_config(
    accelerator: Any, plugin: DeepSpeedPlugin, model: Any, optimizer: Any, scheduler: Any, loaders: list[Any]
) -> dict[str, Any]:
    """The DeepSpeed config with every ``"auto"`` replaced (as the reference fills it); an error naming
    any ``"auto"`` left that nothing here can fill."""
    config = copy.deepcopy(plugin.deepspeed_config)
    micro = _micro_batch(accelerator, plugin, loaders)
    values: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "train_batch_size": micro * int(config["gradient_accumulation_steps"]) * accelerator.num_processes,
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    hidden_keys = [
        f"zero_optimization.{k}"
        for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    ]
    auto_hidden = [k for k in hidden_keys if get_value(config, k) == AUTO]
    if auto_hidden and model is not None:
        size = _hidden_size(model, auto_hidden)
        values.update(dict(zip(hidden_keys, (size * size, int(0.9 * size * size), 10 * size))))
    if isinstance(optimizer, DummyOptim):
        values.update(
            {"optimizer.params.lr": optimizer.lr, "optimizer.params.weight_decay": optimizer.weight_decay}
        )
    if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
        base = scheduler.optimizer
        values.update(
            {
                "scheduler.params.warmup_min_lr": 0,
                "scheduler.params.warmup_max_lr": getattr(base, "lr", None)
                if not hasattr(base, "defaults")
                else base.defaults["lr"],
                "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps),
            }
        )
        if scheduler.total_num_steps is not None:
            total = scheduler.total_num_steps
            values["scheduler.params.total_num_steps"] = (
                total if accelerator.split_batches else -(-total // accelerator.num_processes)
            )
    left: list[str] = []

    def fill(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            dotted = prefix + key
            if isinstance(value, dict):
                fill(value, dotted + ".")
            elif value == AUTO:
                if dotted in values:
                    node[key] = values[dotted]
                else:
                    left.append(dotted)

    fill(config, "")
    if left:
        raise ValueError(
            f"the DeepSpeed config has 'auto' for {', '.join(left)}, which accel_nb cannot fill from the Accelerator "
            "or the prepared objects; give them values in the config"
        )
    if isinstance(optimizer, torch.optim.Optimizer):
        config["zero_allow_untested_optimizer"] = True
        if get_value(config, "zero_optimization.offload_optimizer.device", "none") != "none":
            # the optimizer passed in runs, as given, on the offloaded (CPU) partitions
            config.setdefault("zero_force_ds_cpu_optimizer", False)
    return config


def _check_pairing(plugin: DeepSpeedPlugin, optimizer: Any, scheduler: Any) -> None:
    has_opt, has_sched = "optimizer" in plugin.deepspeed_config, "scheduler" in plugin.deepspeed_config
    if optimizer is not None and has_opt != isinstance(optimizer, DummyOptim):
        raise ValueError(
            "the DeepSpeed config defines an optimizer and prepare() got a torch optimizer too; remove the config's "
            "optimizer section or pass accel_nb.deepspeed.DummyOptim(model.parameters(), lr=...)"
            if has_opt
            else "DummyOptim stands for the DeepSpeed config's optimizer section, and this config has none; add one or "
            "pass a torch optimizer"
        )
    if scheduler is not None:
        if has_sched and not isinstance(scheduler, DummyScheduler):
            raise ValueError(
                "the DeepSpeed config defines a scheduler and prepare() got a scheduler too; remove the config's "
                "scheduler section or pass accel_nb.deepspeed.DummyScheduler(optimizer, ...)"
            )
        if (
            isinstance(scheduler, DummyScheduler)
            and not has_sched
            and scheduler.lr_scheduler_callable is None
        ):
            raise ValueError(
                "DummyScheduler needs a scheduler section in the DeepSpeed config or lr_scheduler_callable="
            )
        if isinstance(optimizer, DummyOptim) is False and isinstance(scheduler, DummyScheduler):
            raise ValueError(
                "DummyScheduler goes with DummyOptim (the config's optimizer); pass a torch scheduler"
            )


def _half_dtype(config: dict[str, Any]) -> torch.dtype | None:
    if get_value(config, "bf16.enabled") is True:
        return torch.bfloat16
    if get_value(config, "fp16.enabled") is True:
        return torch.float16
    return None


def cast_inputs_to(module: torch.nn.Module, dtype: torch.dtype) -> Any:
    """Cast the floating-point tensors ``module`` receives to ``dtype`` (the engine's bf16/fp16 weights
    meet float32 batches otherwise); returns the hook handle.

    The hook runs at every forward: it only looks unless a tensor needs casting (token ids, or inputs
    already in ``dtype``, leave the call's arguments untouched and nothing is rebuilt).
    """

    def needs(value: Any) -> bool:
        if torch.is_tensor(value):
            return value.is_floating_point() and value.dtype != dtype
        if isinstance(value, (list, tuple)):
            return any(needs(v) for v in value)
        if isinstance(value, dict):
            return any(needs(v) for v in value.values())
        return False

    def cast(value: Any) -> Any:
        if torch.is_tensor(value) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return type(value)(*map(cast, value))
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v) for v in value)
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        return value

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
        if not (needs(args) or needs(kwargs)):
            return None  # the call goes on with its own arguments
        return cast(args), cast(kwargs)

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def prepare_deepspeed(accelerator: Any, args: tuple[Any, ...], device_placement: list[Any]) -> list[Any]:
    """``Accelerator.prepare`` with a DeepSpeed plugin: loaders as usual, then one engine for the model,
    its optimizer and scheduler. Returns the prepared objects in the order given."""
    plugin: DeepSpeedPlugin = accelerator.deepspeed_plugin
    result = list(args)
    model = optimizer = scheduler = None
    new_loaders = []
    for i, obj in enumerate(args):
        if isinstance(obj, DataLoader):
            result[i] = accelerator.prepare_data_loader(obj, device_placement=device_placement[i])
            new_loaders.append(obj)
        elif isinstance(obj, torch.nn.Module):
            if accelerator.already_prepared(obj, "model"):
                continue  # a rerun cell: the engine prepare() returned
            if model is not None:
                raise ValueError(
                    "DeepSpeed prepares one model per Accelerator; create an Accelerator per model"
                )
            model = obj
        elif isinstance(obj, (torch.optim.Optimizer, DummyOptim)):
            if accelerator.already_prepared(obj, "optimizer"):
                continue
            optimizer = obj
        elif isinstance(obj, DummyScheduler) or is_lr_scheduler(obj):
            if accelerator.already_prepared(obj, "scheduler"):
                continue
            scheduler = obj
    if model is None:
        if optimizer is not None or scheduler is not None:
            raise ValueError(
                "with DeepSpeed, pass the model, its optimizer (and scheduler) to the same prepare() call: DeepSpeed "
                "builds one engine from them together"
            )
        return result
    if accelerator.deepspeed_engine_wrapped is not None:
        raise ValueError(
            "this Accelerator already prepared a DeepSpeed model; create an Accelerator per model"
        )
    _check_pairing(plugin, optimizer, scheduler)
    loaders = new_loaders or list(accelerator.prepared("dataloader"))
    config = filled_config(accelerator, plugin, model, optimizer, scheduler, loaders)
    deepspeed = import_deepspeed(accelerator.device.type)
    _ensure_process_group(deepspeed, accelerator.device.type)
    kwargs: dict[str, Any] = {"model": model, "config": config}
    if isinstance(optimizer, DummyOptim):
        kwargs["model_parameters"] = optimizer.params
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None:
            kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
    elif optimizer is not None:
        kwargs["optimizer"] = optimizer
    engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(**kwargs)
    half = _half_dtype(config)
    if half is not None:  # float32 batches meet the engine's half-precision weights
        cast_inputs_to(engine.module, half)
    accelerator.deepspeed_config = config
    accelerator.deepspeed_engine_wrapped = DeepSpeedEngineWrapper(engine)
    accelerator.register_prepared(engine, "model")
    wrapped_opt = wrapped_sched = None
    if optimizer is not None:
        wrapped_opt = accelerator.register_prepared(DeepSpeedOptimizerWrapper(ds_optimizer), "optimizer")
    if scheduler is not None:
        if ds_scheduler is not None:  # the config's scheduler (or the callable's): the engine steps it
            wrapped_sched = DeepSpeedSchedulerWrapper(ds_scheduler, [wrapped_opt])
        else:  # a torch scheduler: stepped by the loop after each real optimizer step, as without DeepSpeed
            wrapped_sched = AcceleratedScheduler(
                scheduler,
                [wrapped_opt],
                step_with_optimizer=accelerator.step_scheduler_with_optimizer,
                split_batches=accelerator.split_batches,
                num_processes=accelerator.num_processes,
            )
        accelerator.register_prepared(wrapped_sched, "scheduler")
    for i, obj in enumerate(args):
        if obj is model:
            result[i] = engine
        elif obj is optimizer:
            result[i] = wrapped_opt
        elif obj is scheduler:
            result[i] = wrapped_sched
    return result


def zero3_init(accelerator: Any) -> Any:
    """A context in which models are built already partitioned over the ranks (``deepspeed.zero.Init``), so
    no rank ever holds a whole model; nothing happens unless the plugin has stage 3 and ``zero3_init_flag``.

        with zero3_init(accelerator):
            model = BigModel()
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    """
    plugin = getattr(accelerator, "deepspeed_plugin", None)
    if plugin is None or plugin.zero_stage != 3 or not plugin.zero3_init_flag:
        return contextlib.nullcontext()
    deepspeed = import_deepspeed(accelerator.device.type)
    _ensure_process_group(deepspeed, accelerator.device.type)
    config = copy.deepcopy(plugin.deepspeed_config)
    # only the ZeRO and precision sections matter here; batch "auto"s get stand-ins that pass DeepSpeed's check
    micro = config.get("train_micro_batch_size_per_gpu")
    micro = 1 if micro in (None, AUTO) else micro
    gas = config.get("gradient_accumulation_steps")
    gas = accelerator.gradient_accumulation_steps if gas in (None, AUTO) else gas
    config.update(
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=gas,
        train_batch_size=micro * gas * accelerator.num_processes,
    )

    def drop_auto(node: dict[str, Any]) -> None:
        for key in [k for k, v in node.items() if v == AUTO]:
            del node[key]
        for value in node.values():
            if isinstance(value, dict):
                drop_auto(value)

    drop_auto(config)
    return deepspeed.zero.Init(config_dict_or_path=config)
