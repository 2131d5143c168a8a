"""Kwargs handlers: small dataclasses that customise DDP, the grad scaler, the process group,
autocast and the profiler, passed as ``Accelerator(kwargs_handlers=[...])``.

    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(kwargs_handlers=[ddp])

Each handler checks its values when built and ``to_kwargs()`` returns only the fields that differ
from the defaults (the keyword arguments to pass on). ``read_kwargs_handlers`` turns a list of
handlers into the concrete arguments for each consumer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .counts import is_count

__all__ = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "FP8_RECIPE_NAMES",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "HandlerArguments",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "ProfileKwargs",
    "profile_context",
    "read_kwargs_handlers",
]


class KwargsHandler:
    """Base of every handler: ``to_dict()`` all fields, ``to_kwargs()`` the non-default ones."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from the class default.

        GradScalerKwargs(init_scale=1024.0).to_kwargs()   # {'init_scale': 1024.0}
        """
        default = type(self)().to_dict()
        return {k: v for k, v in self.to_dict().items() if default[k] != v}


class DDPCommunicationHookType(str, enum.Enum):
    """Gradient compression applied by DDP before the all-reduce."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


def _hook_type(value: Any, what: str) -> DDPCommunicationHookType:
    try:
        return DDPCommunicationHookType(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in DDPCommunicationHookType)
        raise ValueError(f"{what}={value!r} is not a DDP communication hook; use one of {choices}") from None


def _check_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{owner}({name}={value!r}): {name} must be a positive number")


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Keyword arguments for ``torch.nn.parallel.DistributedDataParallel`` and a gradient comm hook.

    Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_positive("DistributedDataParallelKwargs", bucket_cap_mb=self.bucket_cap_mb)
        self.comm_hook = _hook_type(self.comm_hook, "comm_hook")
        self.comm_wrapper = _hook_type(self.comm_wrapper, "comm_wrapper")
        if self.comm_wrapper not in (
            DDPCommunicationHookType.NO,
            DDPCommunicationHookType.FP16,
            DDPCommunicationHookType.BF16,
        ):
            raise ValueError(
                f"comm_wrapper={self.comm_wrapper.value!r}: a wrapper compresses to 'fp16' or 'bf16' (or 'no')"
            )
        if self.comm_wrapper is not DDPCommunicationHookType.NO and self.comm_hook not in (
            DDPCommunicationHookType.POWER_SGD,
            DDPCommunicationHookType.BATCHED_POWER_SGD,
        ):
            raise ValueError(
                "comm_wrapper wraps a PowerSGD hook; set comm_hook='power_sgd' or 'batched_power_sgd' too"
            )
        if self.comm_state_option and self.comm_hook not in (
            DDPCommunicationHookType.POWER_SGD,
            DDPCommunicationHookType.BATCHED_POWER_SGD,
        ):
            raise ValueError(
                "comm_state_option configures a PowerSGD hook; set comm_hook='power_sgd' or 'batched_power_sgd'"
            )

    def to_dict(
        self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")
    ) -> dict[str, Any]:
        """The fields, less ``ignore_keys`` (by default the hook fields, as in the reference: what is left,
        and so ``to_kwargs()``, are ``DistributedDataParallel``'s arguments)."""
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}

    def register_comm_hook(self, model: Any) -> None:
        """Install the configured gradient compression on a ``DistributedDataParallel`` model.

        ddp_kwargs.register_comm_hook(ddp_model)   # after wrapping, before the first backward
        """
        if self.comm_hook is DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        state: Any = None
        if self.comm_hook is DDPCommunicationHookType.FP16:
            hook: Callable[..., Any] = default_hooks.fp16_compress_hook
        elif self.comm_hook is DDPCommunicationHookType.BF16:
            hook = default_hooks.bf16_compress_hook
        else:
            hook = powerSGD_hook.powerSGD_hook
            if self.comm_hook is DDPCommunicationHookType.BATCHED_POWER_SGD:
                hook = powerSGD_hook.batched_powerSGD_hook
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
            if self.comm_wrapper is DDPCommunicationHookType.FP16:
                hook = default_hooks.fp16_compress_wrapper(hook)
            elif self.comm_wrapper is DDPCommunicationHookType.BF16:
                hook = default_hooks.bf16_compress_wrapper(hook)
        model.register_comm_hook(state, hook)


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Keyword arguments for the fp16 ``torch.amp.GradScaler``.

    Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self) -> None:
        _check_positive("GradScalerKwargs", init_scale=self.init_scale, growth_interval=self.growth_interval)
        if not self.growth_factor > 1.0:
            raise ValueError(
                f"GradScalerKwargs(growth_factor={self.growth_factor!r}): it must be greater than 1"
            )
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(
                f"GradScalerKwargs(backoff_factor={self.backoff_factor!r}): it must be between 0 and 1"
            )


_BACKENDS = ("nccl", "gloo", "mpi", "ucc", "xla", "cuda:nccl,cpu:gloo")


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Keyword arguments for ``torch.distributed.init_process_group`` (backend, init method, timeout).

    Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(minutes=5))])
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: datetime.timedelta | None = None

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in _BACKENDS:
            raise ValueError(
                f"InitProcessGroupKwargs(backend={self.backend!r}): use one of {', '.join(_BACKENDS)}"
            )
        if isinstance(self.timeout, (int, float)) and not isinstance(self.timeout, bool):
            raise TypeError(
                f"InitProcessGroupKwargs(timeout={self.timeout!r}): pass a datetime.timedelta, "
                f"e.g. datetime.timedelta(seconds={self.timeout})"
            )
        if self.timeout is not None and not isinstance(self.timeout, datetime.timedelta):
            raise TypeError(f"InitProcessGroupKwargs(timeout={self.timeout!r}): pass a datetime.timedelta")
        if self.timeout is not None and self.timeout.total_seconds() <= 0:
            raise ValueError(
                f"InitProcessGroupKwargs(timeout={self.timeout!r}): the timeout must be positive"
            )


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Keyword arguments for ``torch.autocast`` inside ``accelerator.autocast()``.

    Accelerator(mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(cache_enabled=False)])
    """

    enabled: bool = True
    cache_enabled: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"AutocastKwargs(enabled={self.enabled!r}): enabled is True or False")


_ACTIVITIES = ("cpu", "xpu", "mtia", "cuda", "hpu")
_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Settings of ``torch.profiler.profile`` for ``accelerator.profile()``; ``build()`` makes one.

    with ProfileKwargs(activities=["cpu"], record_shapes=True).build() as prof:
        model(x)
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def __post_init__(self) -> None:
        bad = [a for a in self.activities or [] if a not in _ACTIVITIES]
        if bad:
            raise ValueError(
                f"ProfileKwargs(activities=...): unknown {bad}; use some of {', '.join(_ACTIVITIES)}"
            )
        unknown = sorted(set(self.schedule_option or {}) - set(_SCHEDULE_KEYS))
        if unknown:
            raise ValueError(
                f"ProfileKwargs(schedule_option=...): unknown keys {unknown}; use {', '.join(_SCHEDULE_KEYS)}"
            )

    def build(self) -> Any:
        """A ``torch.profiler.profile`` configured from these settings (not started).

        ``output_trace_dir`` is applied by ``profile_context`` (which writes the trace file);
        ``build()`` alone only configures the profiler.
        """
        import torch.profiler as tp

        kinds = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}
        activities = None
        if self.activities is not None:
            missing = [a for a in self.activities if not hasattr(tp.ProfilerActivity, kinds[a])]
            if missing:
                raise ValueError(f"this torch build cannot profile {missing}")
            activities = [getattr(tp.ProfilerActivity, kinds[a]) for a in self.activities]
        schedule = tp.schedule(**self.schedule_option) if self.schedule_option else None
        return tp.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@contextlib.contextmanager
def profile_context(handler: ProfileKwargs | None = None, process_index: int = 0) -> Iterator[Any]:
    """Profile the block with ``handler``'s settings; with ``output_trace_dir`` write a Chrome trace
    ``profile_{process_index}.json`` there when the block ends (what ``Accelerator.profile()`` does).

        with profile_context(ProfileKwargs(activities=["cpu"], output_trace_dir="traces")) as prof:
            train_step()
        print(prof.key_averages().table())
    """
    handler = handler if handler is not None else ProfileKwargs()
    with handler.build() as prof:
        yield prof
    if handler.output_trace_dir:
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{process_index}.json"))


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves: steps, scheduler adjustment, sync at the end of a loader.

    Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4))
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is not None and not is_count(self.num_steps):
            raise ValueError(
                f"GradientAccumulationPlugin(num_steps={self.num_steps!r}): num_steps is a whole number >= 1"
            )


@dataclasses.dataclass
class HandlerArguments:
    """What a list of handlers asks for, split by consumer (each a dict of keyword arguments)."""

    ddp: dict[str, Any] = dataclasses.field(default_factory=dict)
    scaler: dict[str, Any] = dataclasses.field(default_factory=dict)
    init_process_group: dict[str, Any] = dataclasses.field(default_factory=dict)
    autocast: dict[str, Any] = dataclasses.field(default_factory=dict)
    ddp_handler: DistributedDataParallelKwargs | None = None  # for register_comm_hook after wrapping
    profile: ProfileKwargs | None = None
    gradient_accumulation: GradientAccumulationPlugin | None = None
    given: dict[str, KwargsHandler] = dataclasses.field(default_factory=dict)  # each handler, by slot
    fp8_recipe: Any = None  # an FP8 recipe (accel_nb.precision.fp8_recipes), read by accel_nb.precision.fp8


# the FP8 recipes (defined in accel_nb.precision.fp8_recipes, which builds on KwargsHandler): one per run
FP8_RECIPE_NAMES = ("AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs")

_SLOTS = {
    "DistributedDataParallelKwargs": ("ddp", DistributedDataParallelKwargs),
    "GradScalerKwargs": ("scaler", GradScalerKwargs),
    "InitProcessGroupKwargs": ("init_process_group", InitProcessGroupKwargs),
    "AutocastKwargs": ("autocast", AutocastKwargs),
    "ProfileKwargs": ("profile", ProfileKwargs),
    "GradientAccumulationPlugin": ("gradient_accumulation", GradientAccumulationPlugin),
}


def _as_ours(handler: Any) -> tuple[str, KwargsHandler]:
    """Our handler for ``handler`` (the reference library's instances are converted field by field)."""
    name = type(handler).__name__
    if name not in _SLOTS or not callable(getattr(handler, "to_dict", None)):
        raise ValueError(
            f"kwargs_handlers got {name} ({handler!r}); accel_nb understands {', '.join((*_SLOTS, *FP8_RECIPE_NAMES))} "
            "(from accel_nb.utils)"
        )
    slot, cls = _SLOTS[name]
    if isinstance(handler, cls):
        return slot, handler
    fields = {f.name for f in dataclasses.fields(cls)}
    # every field, read off the object (the reference's DDP to_dict() leaves out the hook fields)
    values = {k: getattr(handler, k) for k in fields if hasattr(handler, k)}
    for key in ("comm_hook", "comm_wrapper"):
        if key in values and isinstance(values[key], enum.Enum):
            values[key] = values[key].value
    return slot, cls(**values)


def read_kwargs_handlers(handlers: Iterable[Any] | None) -> HandlerArguments:
    """Split ``Accelerator(kwargs_handlers=[...])`` into the arguments of DDP, the scaler, the group, autocast.

    args = read_kwargs_handlers([DistributedDataParallelKwargs(find_unused_parameters=True)])
    args.ddp   # {'find_unused_parameters': True}
    """
    out = HandlerArguments()
    seen: set[str] = set()
    for handler in handlers or []:
        if type(handler).__name__ in FP8_RECIPE_NAMES and callable(getattr(handler, "to_dict", None)):
            if out.fp8_recipe is not None:
                raise ValueError(
                    f"kwargs_handlers holds two FP8 recipes ({type(out.fp8_recipe).__name__} and "
                    f"{type(handler).__name__}); pass one"
                )
            out.fp8_recipe = handler
            continue
        slot, ours = _as_ours(handler)
        if slot in seen:
            raise ValueError(
                f"kwargs_handlers holds two {type(ours).__name__}; pass one and merge their settings"
            )
        seen.add(slot)
        out.given[slot] = ours
        if slot in ("profile", "gradient_accumulation"):
            setattr(out, slot, ours)
            continue
        setattr(out, slot, ours.to_kwargs())
        if slot == "ddp":
            out.ddp_handler = ours  # type: ignore[assignment]
    return out
