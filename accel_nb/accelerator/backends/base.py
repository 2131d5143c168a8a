"""The training back-end interface and its registry: one class per back-end, chosen once per Accelerator.

A back-end is how a run spreads its model over the processes: plain data parallel (``ddp``, which is
also the one-process run), FSDP2 sharding (``fsdp``), DeepSpeed ZeRO (``deepspeed``), the TP/CP/PP
layout on a device mesh (``layout``) or XLA devices (``xla``). The Accelerator asks its back-end
(``accelerator.backend``) instead of testing which one it runs; so do ``checkpoint/`` and the launch
config (``config/``), which reads only the class-level launch parts (no Accelerator exists there).

What a back-end decides:

- prepare: the order objects are prepared in (``prepare``), where a model goes (``place``), what wraps
  it (``wrap``), what follows a prepared model (``after_model``: optimizers re-pointed at new
  parameters, DDP's communication hook), what an optimizer needs (``adopt_optimizer``) and how loaders
  split the data (``data_shards``);
- the step: ``backward``, ``no_sync`` (the accumulation boundary), ``partial_gradients`` (clipping only on
  sync steps), ``gather_for_metrics``, ``clip_grad_norm_`` / ``clip_grad_value_`` (``before_clipping`` for XLA's reduce);
- checkpoints: whether every rank must take part (``needs_every_rank``), what it writes itself
  (``save_parts``) and reads back (``read_parts``), the full weights of a spread-out model (``gathered_weights``);
- the launch config: the ``distributed_type`` values it answers to (``launch_types``), its section
  (``config_key``), ``check_launch_config``, ``hardware_notes``, ``launch_env``, ``launch_flags``,
  ``keeps_distributed_type``.

Adding a back-end (Megatron-LM, say):

1. write ``accel_nb/accelerator/backends/<name>.py`` with a subclass of ``TrainingBackend`` (or of the
   closest one, e.g. ``DdpBackend``) decorated with ``@register_backend``; override only what differs;
   import torch and the back-end's library inside the methods (``accel_nb.config`` imports this package
   to read the launch parts, and ``import accel_nb`` stays light);
2. import the module in ``backends/__init__.py`` (registration order is the order ``launch_backend`` looks);
3. say when it is chosen in ``backends/selection.py`` (``choose_backend``: it returns a registered name).

A precision feature that rewrites the model before the back-end wraps it (FP8 next) is not a back-end:
subclass ``ModelConversion``, decorate it with ``@register_conversion``, import its module in
``backends/__init__.py``; ``prepare`` applies every conversion whose ``applies`` is true to each model
after placing it and before ``wrap`` (so DDP/FSDP see the converted layers), in registration order.

    accelerator.backend.name                        # 'ddp', 'fsdp', 'deepspeed', 'layout' or 'xla'
    launch_backend("FSDP").launch_env(cfg)          # the environment a launch gives each rank
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

__all__ = [
    "BACKENDS",
    "CONVERSIONS",
    "ModelConversion",
    "TrainingBackend",
    "backend_named",
    "conversions_for",
    "kind_of",
    "launch_backend",
    "register_backend",
    "register_conversion",
]

BACKENDS: dict[str, type[TrainingBackend]] = {}  # name -> class, in registration order
CONVERSIONS: dict[str, type[ModelConversion]] = {}  # name -> class, applied in registration order


def register_backend(cls: type[TrainingBackend]) -> type[TrainingBackend]:
    """Class decorator: make ``cls`` a back-end under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name to be registered as a training back-end")
    BACKENDS[cls.name] = cls
    return cls


def register_conversion(cls: type[ModelConversion]) -> type[ModelConversion]:
    """Class decorator: make ``cls`` a model conversion (a precision such as FP8) under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name to be registered as a model conversion")
    CONVERSIONS[cls.name] = cls
    return cls


def backend_named(name: str) -> type[TrainingBackend]:
    """The registered back-end class called ``name``; a clear error naming the known ones otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"no training back-end named {name!r}; known: {', '.join(BACKENDS)}") from None


def launch_backend(distributed_type: str) -> type[TrainingBackend]:
    """The back-end a launch config's ``distributed_type`` means (``ddp`` for NO, MULTI_CPU, MULTI_GPU ...)."""
    for cls in BACKENDS.values():
        if distributed_type in cls.launch_types:
            return cls
    return BACKENDS["ddp"]


def kind_of(obj: Any) -> str | None:
    """What ``prepare`` sees in ``obj``: "model", "optimizer", "dataloader", "scheduler" or None (left as is)."""
    import torch
    from torch.utils.data import DataLoader

    from ..optim import is_lr_scheduler

    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, DataLoader):
        return "dataloader"
    if is_lr_scheduler(obj):
        return "scheduler"
    return None


class TrainingBackend:
    """One training back-end, bound to one Accelerator (``self.accelerator``); the defaults are a plain run."""

    name: ClassVar[str] = ""
    launch_types: ClassVar[tuple[str, ...]] = ()  # the launch config's distributed_type values meaning it
    config_key: ClassVar[str | None] = None  # its section of the launch config (fsdp_config, ...)
    shards_with_fsdp: bool = False  # prepared models are sharded with FSDP2 (``Accelerator.is_fsdp2``)
    casts_by_itself: bool = False  # casts to the mixed precision itself: no autocast forward (native_amp)

    def __init__(self, accelerator: Any) -> None:
        # weakly: the Accelerator holds its back-end, and a cycle would keep both (and the prepared loaders)
        # alive after the last reference to the Accelerator goes, until the garbage collector runs
        self._accelerator = weakref.ref(accelerator)
        # id(original parameter) -> weakrefs to it and to what prepare made of it (sharded, moved); optimizers
        # prepared before their model are re-pointed through it (accel_nb.fsdp.sharding.repoint_optimizer)
        self.parameter_swap: dict[int, Any] = {}

    @property
    def accelerator(self) -> Any:
        """The Accelerator this back-end serves."""
        return self._accelerator()

    def __getstate__(self) -> dict[str, Any]:
        # weak references do not pickle: a pickled Accelerator (the reference's users pickle one with its
        # prepared loaders) links its back-end again when it is loaded (``relink``)
        state = dict(self.__dict__)
        state["_accelerator"] = None
        state["parameter_swap"] = {}
        return state

    def relink(self, accelerator: Any) -> None:
        """Serve ``accelerator`` (an Accelerator loaded from a pickle holds its back-end unlinked)."""
        self._accelerator = weakref.ref(accelerator)

    @property
    def joins_uneven_inputs(self) -> bool:
        """Whether ``join_uneven_inputs`` applies torch's Join: DDP over several processes, as the run's
        ``distributed_type`` says now (the reference's multi-device types and MULTI_CPU, where gloo DDP joins)."""
        from ...state import DistributedType as T

        ddp = (
            T.MULTI_CPU,
            T.MULTI_GPU,
            T.MULTI_MLU,
            T.MULTI_SDAA,
            T.MULTI_MUSA,
            T.MULTI_NPU,
            T.MULTI_XPU,
            T.MULTI_HPU,
        )
        return self.accelerator.distributed_type in (*ddp, T.MULTI_NEURON)

    @property
    def partial_gradients(self) -> bool:
        """Gradients are not whole between sync steps (FSDP2 shards): clipping waits for the sync step."""
        return self.shards_with_fsdp

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    # -- the launch config (no Accelerator yet: class methods) ------------------------------------------
    @classmethod
    def check_launch_config(cls, cfg: Any, path: str | None) -> None:
        """Check the config's section of this back-end; a section the chosen type does not read warns."""
        if cls.config_key and cfg.distributed_type not in cls.launch_types and cfg.extras.get(cls.config_key):
            from ...config.values import warn_once  # deferred: config imports this package

            warn_once(
                cls.config_key,
                f"{cls.config_key} in {path or 'the config'} has no effect with distributed_type="
                f"{cfg.distributed_type}; {cls.inert_advice}",
            )

    inert_advice: ClassVar[str] = ""

    @classmethod
    def hardware_notes(cls, cfg: Any, hw: Any, path: str | None) -> list[str]:
        """Problems of this machine for this back-end: notes returned, a ConfigError raised when it cannot run."""
        return []

    @classmethod
    def launch_env(cls, cfg: Any, num_processes: int | None = None) -> dict[str, str]:
        """The environment every rank gets so its Accelerator chooses this back-end ({} when the config does
        not ask for it); ``num_processes``: the launch's processes in all, when not the config's own.
        ``LaunchConfig.backends_env`` merges every registered back-end's, for every kind of launch."""
        return {}

    @classmethod
    def launch_flags(cls, cfg: Any) -> list[str]:
        """The ``accel-nb launch`` flags that say this back-end and its settings ([] by default)."""
        return []

    @classmethod
    def keeps_distributed_type(cls, several: bool) -> bool:
        """Whether a config keeps this ``distributed_type`` when its process count changes (``several``: more than 1)."""
        return False

    # -- prepare --------------------------------------------------------------------------------------
    def prepare(self, args: tuple[Any, ...], device_placement: list[Any]) -> list[Any]:
        """``Accelerator.prepare``: models first, then optimizers, loaders and schedulers; others as given."""
        acc = self.accelerator
        result: list[Any] = list(args)
        kinds = [kind_of(obj) for obj in args]
        for kind in ("model", "optimizer", "dataloader", "scheduler"):
            for i, obj in enumerate(args):
                if kinds[i] != kind:
                    continue
                if kind == "model":
                    result[i] = acc.prepare_model(obj, device_placement=device_placement[i])
                elif kind == "optimizer":
                    result[i] = acc.prepare_optimizer(obj, device_placement=device_placement[i])
                elif kind == "dataloader":
                    result[i] = acc.prepare_data_loader(obj, device_placement=device_placement[i])
                else:
                    result[i] = acc.prepare_scheduler(obj)
        return result

    def refuse_rewrap(self, model: torch.nn.Module) -> None:
        """A clear error when ``model`` is (or holds) one this Accelerator already wrapped (nothing by default)."""

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` on the process's device."""
        return model.to(self.accelerator.device)

    def compiles_in_place(self) -> bool:
        """Whether torch.compile compiles the model in place (the sharding sees the model's own names)."""
        return False

    def wrap(self, model: torch.nn.Module, evaluation_mode: bool) -> torch.nn.Module:
        """``model`` in what spreads it over the processes (the model itself by default)."""
        return model

    def after_model(self, model: torch.nn.Module) -> None:
        """After a model is prepared (optimizers prepared before it follow its new parameters, ...)."""

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Before an optimizer is wrapped: point it at the parameters prepare made (nothing by default)."""

    def data_shards(self) -> tuple[int, int]:
        """How many shards loaders split the data into, and this process's one."""
        acc = self.accelerator
        return acc.num_processes, acc.process_index

    def check_dispatch(self, dispatch_batches: Any) -> None:
        """A clear error when loaders cannot dispatch batches with this back-end (nothing by default)."""

    # -- the training step ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled in fp16."""
        acc = self.accelerator
        if acc.gradient_accumulation_steps > 1:
            loss = loss / acc.gradient_accumulation_steps
        if acc.scaler is not None:
            loss = acc.scaler.scale(loss)
        loss.backward(**kwargs)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """What skips the gradient exchange of the backward passes inside (nothing by default)."""
        return contextlib.nullcontext()

    def before_clipping(self) -> None:
        """Right before gradients are clipped, on a sync step (nothing by default)."""

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float) -> Any:
        """``Accelerator.clip_grad_norm_``: None where gradients are partial or scaled (not a sync step), else
        unscale fp16 gradients and clip their total norm; returns the norm."""
        acc = self.accelerator
        if (acc.scaler is not None or self.partial_gradients) and not acc.sync_gradients:
            return None
        if acc.scaler is not None:
            acc.unscale_gradients()
        self.before_clipping()
        return self.clip_norm(parameters, max_norm, norm_type)

    def clip_norm(self, parameters: Any, max_norm: float, norm_type: float) -> Any:
        """Clip the gradients' total norm; returns the norm (a plain tensor)."""
        import torch

        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        return (
            norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        )  # FSDP: a DTensor of the global norm

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """``Accelerator.clip_grad_value_``: like ``clip_grad_norm_``, each gradient clipped to ``[-clip_value, clip_value]``."""
        import torch

        acc = self.accelerator
        if (acc.scaler is not None or self.partial_gradients) and not acc.sync_gradients:
            return
        if acc.scaler is not None:
            acc.unscale_gradients()
        self.before_clipping()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool) -> Any:
        """``Accelerator.gather_for_metrics``: every process's predictions, without the samples repeated to even
        out the last batch."""
        from ... import ops

        return ops.gather_for_metrics(input_data, use_gather_object, self.accelerator.gradient_state)

    # -- checkpoints ----------------------------------------------------------------------------------
    def needs_every_rank(self) -> str | None:
        """Why a checkpoint needs every process (each holds a part of the state), or None."""
        return None

    def save_parts(self, folder: str, weights: list[Any]) -> dict[int, Any]:
        """Every rank, in ``save_state``: write what this back-end saves itself into ``folder``.

        A model whose entry of ``weights`` it sets to None is not written again; the returned dict maps an
        optimizer's index to the state the main process writes instead (None: not written at all).
        """
        return {}

    def read_parts(self, plan: dict[str, Any]) -> None:
        """Every rank, in ``load_state`` once every rank's checks passed (so it may run collectives): restore
        what ``save_parts`` wrote, taking those entries out of ``plan`` (``plan["models"]`` holds
        ``(module, source)`` pairs, ``plan["optimizers"]`` ``(optimizer, state)``; the rest is loaded as usual)."""

    def gathered_weights(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The full weights of ``model`` when its parameters are spread over the ranks (call it on every rank;
        the main process gets them), None when the model is whole in every process."""
        from ...fsdp.sharding import is_sharded_model

        if is_sharded_model(model):  # FSDP2 or tensor-parallel DTensors: gathered from every rank
            from ...fsdp.state_dicts import full_model_state

            return full_model_state(model)
        return None


class ModelConversion:
    """A change of the model's layers made by ``prepare`` before the back-end wraps it (a precision such as FP8).

    ``applies`` says whether the run asks for it (read the Accelerator's settings); ``convert`` returns the
    model to go on with (converted in place, or a new module holding the same parameters, so optimizers
    made before ``prepare`` keep training them).
    """

    name: ClassVar[str] = ""

    @classmethod
    def applies(cls, accelerator: Any) -> bool:
        return False

    def convert(self, accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError


def conversions_for(accelerator: Any) -> list[ModelConversion]:
    """The registered conversions the run asks for, in registration order (chosen once, with the back-end)."""
    return [cls() for cls in CONVERSIONS.values() if cls.applies(accelerator)]
