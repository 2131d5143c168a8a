"""FP8 training: from ``mixed_precision="fp8"`` and a recipe to the model's linear layers in float8.

accel_nb trains FP8 with torchao (``torchao.float8.convert_to_float8_training``): each chosen ``nn.Linear``
becomes a ``Float8Linear`` whose matmuls run in float8 with dynamic scales; the rest of the forward runs under
bf16 autocast (the reference's meaning of "fp8"). TransformerEngine and MS-AMP recipes are accepted and refused
with the cause (their package, a GPU, or accel_nb's missing path for them).

Two hooks use this module: the Accelerator's constructor calls :func:`configure_fp8` (the recipe, the backend,
the refusals, the reference's attributes), and ``prepare`` converts each model through :func:`convert_model`
before DDP/FSDP2/torch.compile wrap it. Converting keeps the model's parameter objects (so an optimizer made
before ``prepare`` trains every one of them); only FSDP2's float8 all-gather needs new parameters, and those
are recorded so optimizers follow them.

    model, swap = convert_model(model, AORecipeKwargs(), sharded=False)
    has_ao_layers(model)        # True
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..availability import is_msamp_available, is_torchao_available, is_transformer_engine_available
from .fp8_recipes import (
    AORecipeKwargs,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
    fp8_env,
)

__all__ = [
    "Fp8Setup",
    "configure_fp8",
    "convert_model",
    "convert_model_to_fp8_ao",
    "default_layer_filter",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]

_CLASSES = {
    "AORecipeKwargs": AORecipeKwargs,
    "TERecipeKwargs": TERecipeKwargs,
    "MSAMPRecipeKwargs": MSAMPRecipeKwargs,
    "FP8RecipeKwargs": FP8RecipeKwargs,
}
_ATTRS = {  # the reference's Accelerator attribute for each recipe class
    "AORecipeKwargs": "ao_recipe_handler",
    "TERecipeKwargs": "te_recipe_handler",
    "MSAMPRecipeKwargs": "msamp_recipe_handler",
    "FP8RecipeKwargs": "fp8_recipe_handler",
}
_NOT_BUILT = (
    "accel_nb trains FP8 with torchao only (its {name} path is not built: it needs CUDA, which accel_nb's "
    "tests cannot run); use Accelerator(mixed_precision='fp8', kwargs_handlers=[AORecipeKwargs()])"
)


# -- which layers become Float8Linear ---------------------------------------------------------------------
def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """The names of the first and of the last ``nn.Linear`` in ``model`` (in ``named_modules`` order)."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """True when ``module`` may become float8: not named in ``layers_to_filter`` and, for an ``nn.Linear``,
    both sizes multiples of 16 (what float8 matmuls need)."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """The reference's filter over ``module`` itself: its own first and last linear layers are kept in high
    precision. Given one layer at a time (as torchao does), it filters nothing: use
    :func:`default_layer_filter` (which knows the whole model)."""
    return filter_linear_layers(module, fqn, list(find_first_last_linear_layers(module)))


def default_layer_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    """accel_nb's default ``module_filter_func`` for ``model``: every linear layer but the first and the last
    (kept in high precision for stability) and those with a size that is not a multiple of 16."""
    first, last = find_first_last_linear_layers(model)
    return functools.partial(filter_linear_layers, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """True when ``model`` holds a torchao ``Float8Linear`` (it was converted for float8 training)."""
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


# -- the conversion ----------------------------------------------------------------------------------------
def convert_model(
    model: torch.nn.Module, recipe: AORecipeKwargs, sharded: bool
) -> tuple[torch.nn.Module, dict[int, Any]]:
    """``model`` with its chosen linear layers as ``Float8Linear`` (in place unless the model is one
    ``nn.Linear``), and the parameters that changed: ``{id(old): (weakref(old), weakref(new))}``.

    Layers already converted are left alone (a model prepared twice). Without FSDP2 (``sharded=False``) the
    float8 all-gather setting is switched off: it only acts on sharded weights, and with it torchao gives each
    weight a new parameter object that optimizers made before would not train.
    """
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = recipe.config
    if not sharded and config.enable_fsdp_float8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=False)
    chosen = recipe.module_filter_func or default_layer_filter(model)

    def keep(module: torch.nn.Module, fqn: str) -> bool:
        return not isinstance(module, Float8Linear) and bool(chosen(module, fqn))

    before = dict(model.named_parameters())
    converted = convert_to_float8_training(model, module_filter_fn=keep, config=config)
    after = dict(converted.named_parameters())
    swap = {
        id(old): (weakref.ref(old), weakref.ref(after[name]))
        for name, old in before.items()
        if name in after and after[name] is not old
    }
    return converted, swap


def convert_model_to_fp8_ao(
    model: torch.nn.Module, config: Any = None, module_filter_func: Callable[..., bool] | None = None
) -> torch.nn.Module:
    """The reference's ``convert_model_to_fp8_ao``: convert ``model``'s linear layers (all but the first and
    the last, by default) to torchao's ``Float8Linear`` in place, with ``config`` (a ``Float8LinearConfig``)."""
    if not is_torchao_available():
        raise ImportError("convert_model_to_fp8_ao needs torchao: pip install torchao")
    from torchao.float8 import convert_to_float8_training

    chosen = module_filter_func or default_layer_filter(model)
    return convert_to_float8_training(model, module_filter_fn=chosen, config=config)


# -- the Accelerator's side ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Fp8Setup:
    """What an FP8 run does: the backend (always ``AO`` here) and the torchao recipe."""

    backend: FP8BackendType
    recipe: AORecipeKwargs

    def check_layout(self, accelerator: Any) -> None:
        """A clear error for the parallel layouts FP8 is not built for (tensor/context/pipeline parallel)."""
        layout = getattr(accelerator, "parallel_layout", None)
        config = getattr(layout, "config", None)
        sizes = {n: getattr(config, f"{n}_size", 1) or 1 for n in ("tp", "cp")}
        if any(size > 1 for size in sizes.values()):
            raise ValueError(
                f"mixed_precision='fp8' with tensor or context parallel ({sizes}) is not supported by accel_nb; "
                "FP8 runs with one process, DDP and FSDP2 (ParallelismConfig with dp sizes only)"
            )

    def convert(self, accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` converted for this run; new parameters (FSDP2's float8 all-gather) are recorded in the
        back-end's ``parameter_swap`` so optimizers made before ``prepare`` follow them."""
        self.check_layout(accelerator)
        backend = getattr(accelerator, "backend", None)
        sharded = bool(getattr(backend, "shards_with_fsdp", False))
        model, swap = convert_model(model, self.recipe, sharded)
        for old_ref, new_ref in swap.values():
            # the old parameter keeps its float8 successor alive: FSDP2 replaces that one with its shard right
            # after, and an optimizer still holding the old one follows old -> new -> shard (both share storage)
            old_ref()._accel_nb_replaced_by = new_ref()
        if swap and backend is not None:
            backend.parameter_swap.update(swap)
        return model


def _as_ours(handler: Any) -> Any:
    """An accel_nb recipe for ``handler`` (the reference's instances are converted field by field)."""
    name = type(handler).__name__
    cls = _CLASSES[name]
    if isinstance(handler, cls):
        return handler
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: getattr(v, "value", v) for k, v in handler.to_dict().items() if k in fields}
    return cls(**values)


def _backend_of(recipe: Any) -> FP8BackendType:
    if isinstance(recipe, AORecipeKwargs):
        return FP8BackendType.AO
    if isinstance(recipe, FP8RecipeKwargs):
        return FP8BackendType(recipe.backend)
    return FP8BackendType.TE if isinstance(recipe, TERecipeKwargs) else FP8BackendType.MSAMP


def _chosen_backend() -> FP8BackendType:
    """The launch's ``fp8_config.backend`` (the environment), else the first installed: torchao, TE, MS-AMP."""
    named = fp8_env("backend")
    if named:
        try:
            return FP8BackendType(str(named).strip().upper())
        except ValueError:
            raise ValueError(
                f"fp8 backend {named!r} (ACCELERATE_FP8_BACKEND / the config's fp8_config.backend) is not one of "
                "AO (torchao), TE (TransformerEngine), MSAMP (MS-AMP)"
            ) from None
    for backend, available in (
        (FP8BackendType.AO, is_torchao_available),
        (FP8BackendType.TE, is_transformer_engine_available),
        (FP8BackendType.MSAMP, is_msamp_available),
    ):
        if available():
            return backend
    raise ImportError(
        "mixed_precision='fp8' needs a library that trains in FP8 and none is installed: pip install torchao "
        "(accel_nb's FP8 path; TransformerEngine and MS-AMP need an NVIDIA GPU)"
    )


def _refuse_gpu_only(backend: FP8BackendType, device: torch.device) -> None:
    name, package, available = {
        FP8BackendType.TE: ("TransformerEngine", "transformer-engine", is_transformer_engine_available),
        FP8BackendType.MSAMP: ("MS-AMP", "ms-amp (built from github.com/Azure/MS-AMP)", is_msamp_available),
    }[backend]
    if not available():
        raise ImportError(
            f"the FP8 backend {backend.value} needs {name}, which is not installed ({package}; it needs CUDA); "
            "on this machine use torchao: AORecipeKwargs() or fp8_config: {backend: AO}"
        )
    if device.type != "cuda":
        raise ValueError(
            f"the FP8 backend {backend.value} ({name}) runs on NVIDIA GPUs only and this run's device is "
            f"{device}; use torchao (AORecipeKwargs(), fp8_config: {{backend: AO}}), which runs on CPU too"
        )
    raise NotImplementedError(_NOT_BUILT.format(name=name))


def configure_fp8(accelerator: Any, handler: Any) -> Fp8Setup | None:
    """Read the run's FP8 recipe and set the reference's attributes on ``accelerator`` (``fp8_enabled``,
    ``fp8_backend``, ``fp8_recipe_handler``, ``ao_recipe_handler``, ``te_recipe_handler``,
    ``msamp_recipe_handler``, ``has_fp8_handler``); returns the setup ``prepare`` uses, None without FP8.

    Clear errors, before anything runs: a recipe without ``mixed_precision='fp8'``, fp8 with DeepSpeed or on
    XLA, and TransformerEngine / MS-AMP (the package or a GPU missing, or accel_nb's path not built).
    """
    recipe = _as_ours(handler) if handler is not None else None
    for attr in _ATTRS.values():
        setattr(accelerator, attr, None)
    if recipe is not None:
        setattr(accelerator, _ATTRS[type(recipe).__name__], recipe)
    accelerator.has_fp8_handler = recipe is not None
    accelerator.delayed_fp8_autocast = False
    enabled = accelerator.state.mixed_precision == "fp8"
    accelerator.fp8_enabled = enabled
    if not enabled:
        accelerator.fp8_backend = FP8BackendType.NO
        if recipe is not None:
            raise ValueError(
                f"{type(recipe).__name__} in kwargs_handlers needs mixed_precision='fp8' (this run's is "
                f"{accelerator.state.mixed_precision!r}); pass Accelerator(mixed_precision='fp8', ...) or drop the recipe"
            )
        return None
    backend = _backend_of(recipe) if recipe is not None else _chosen_backend()
    accelerator.fp8_backend = backend
    device = accelerator.state.device
    if getattr(accelerator, "deepspeed_plugin", None) is not None:
        raise ValueError(
            "mixed_precision='fp8' with DeepSpeed is not supported by accel_nb; use FP8 with DDP or FSDP2"
        )
    if device.type == "xla":
        raise ValueError("mixed_precision='fp8' is not supported on XLA devices (TPU cores); use 'bf16'")
    if backend is not FP8BackendType.AO:
        _refuse_gpu_only(backend, device)
    if recipe is None:
        recipe = AORecipeKwargs()
        accelerator.ao_recipe_handler = recipe
        accelerator.has_fp8_handler = True
    return Fp8Setup(backend, recipe)
