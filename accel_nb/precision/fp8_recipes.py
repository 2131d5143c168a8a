"""The FP8 recipes a user passes in ``Accelerator(kwargs_handlers=[...])``, under the reference's names.

``AORecipeKwargs`` (torchao's float8 training: the one accel_nb runs, on CPU and GPU), ``TERecipeKwargs``
(TransformerEngine), ``MSAMPRecipeKwargs`` (MS-AMP) and the reference's deprecated ``FP8RecipeKwargs``
(``backend="te"`` or ``"msamp"``). Each field left as None takes the reference's environment variable
(``ACCELERATE_FP8_<FIELD>``, or accel_nb's ``ACCEL_NB_FP8_<FIELD>`` first), which is how a launch config's
``fp8_config`` reaches the ranks, then the reference's default.

    Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(module_filter_func=keep)])

Light on purpose: torchao is imported only when an ``AORecipeKwargs`` builds its ``Float8LinearConfig``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import warnings
from collections.abc import Callable
from typing import Any

from ..availability import is_msamp_available, is_torchao_available, is_transformer_engine_available
from ..kwargs_handlers import FP8_RECIPE_NAMES, KwargsHandler

__all__ = [
    "AORecipeKwargs",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "FP8_RECIPE_NAMES",
    "MSAMPRecipeKwargs",
    "TERecipeKwargs",
    "fp8_env",
    "fp8_launch_env",
]

_FORMATS = ("HYBRID", "E4M3", "E5M2")
_AMAX_ALGOS = ("max", "most_recent")
_OPT_LEVELS = ("O1", "O2")
_TRUE = ("1", "true", "yes", "y", "on", "t")


class FP8BackendType(str, enum.Enum):
    """Which library trains in FP8: ``AO`` (torchao), ``TE`` (TransformerEngine), ``MSAMP`` (MS-AMP), or ``NO``."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def fp8_env(name: str, default: Any = None) -> Any:
    """The launch's value of FP8 setting ``name`` (``ACCEL_NB_FP8_<NAME>``, else ``ACCELERATE_FP8_<NAME>``)."""
    key = name.upper()
    return os.environ.get(f"ACCEL_NB_FP8_{key}", os.environ.get(f"ACCELERATE_FP8_{key}", default))


# the reference's config questionnaire writes these fp8_config keys; its recipes read the shorter names
_KEY_ALIASES = {
    "amax_history_length": "amax_history_len",
    "amax_compute_algorithm": "amax_compute_algo",
    "optimization_level": "opt_level",
    "fp8_format": "format",
}


def fp8_launch_env(mixed_precision: str, fp8_config: dict[str, Any] | None) -> dict[str, str]:
    """The environment a launch gives each rank for the config's ``fp8_config`` (with ``mixed_precision: fp8``):
    ``ACCELERATE_FP8_<KEY>`` and ``ACCEL_NB_FP8_<KEY>``, which the recipes read. A backend no rank can run
    here (an unknown name, TransformerEngine or MS-AMP not installed) is a ValueError before any rank starts.

        fp8_launch_env("fp8", {"backend": "AO", "pad_inner_dim": False})["ACCELERATE_FP8_BACKEND"]   # 'AO'
    """
    if mixed_precision != "fp8":
        return {}
    values: dict[str, Any] = {}
    for key, value in (fp8_config or {}).items():
        if value is None:
            continue
        key = str(key).removeprefix("fp8_") if str(key) != "fp8_format" else str(key)
        key = _KEY_ALIASES.get(key, key)
        if key == "override_linear_precision":
            parts = value.split(",") if isinstance(value, str) else list(value)
            for part, flag in zip(("fprop", "dgrad", "wgrad"), parts):
                values[f"override_{part}"] = str(flag).strip()
            continue
        values[key] = str(getattr(value, "value", value))
    backend = values.get("backend")
    if backend is not None:
        backend = values["backend"] = str(backend).strip().upper()
        known = {
            "AO": is_torchao_available,
            "TE": is_transformer_engine_available,
            "MSAMP": is_msamp_available,
        }
        if backend not in known:
            raise ValueError(f"fp8_config backend={backend!r}: use AO (torchao), TE or MSAMP")
        if not known[backend]():
            raise ValueError(
                f"fp8_config backend={backend}: its library is not installed on this machine"
                + ("" if backend == "AO" else " (it needs an NVIDIA GPU and CUDA)")
                + "; use backend: AO with torchao (pip install torchao)"
            )
    elif not (is_torchao_available() or is_transformer_engine_available() or is_msamp_available()):
        raise ValueError(
            "mixed_precision: fp8 needs torchao on this machine (pip install torchao), or use bf16"
        )
    env: dict[str, str] = {}
    for key, value in values.items():
        env[f"ACCELERATE_FP8_{key.upper()}"] = env[f"ACCEL_NB_FP8_{key.upper()}"] = value
    return env


def _flag(name: str, default: bool) -> bool:
    value = fp8_env(name)
    return default if value is None else str(value).strip().lower() in _TRUE


def _one_of(owner: str, field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}({field}={value!r}): {field} must be one of {', '.join(choices)}")


@dataclasses.dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao's float8 training: which ``Float8LinearConfig``, and which linear layers become ``Float8Linear``.

    ``config`` defaults to ``Float8LinearConfig(pad_inner_dim=True, enable_fsdp_float8_all_gather=True)`` (the
    reference's defaults; the all-gather setting only acts when FSDP2 shards the model). ``module_filter_func``
    (``fn(module, fully_qualified_name) -> bool``) defaults to skipping the first and the last linear layer and
    any whose sizes are not multiples of 16 (``accel_nb.precision.fp8.default_layer_filter``).

        AORecipeKwargs(module_filter_func=lambda m, name: "lm_head" not in name)
    """

    config: Any = None
    module_filter_func: Callable[..., bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        if not is_torchao_available():
            raise ImportError(
                "AORecipeKwargs needs torchao 0.6.1 or newer (its float8 training): pip install torchao"
            )
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            raise TypeError(
                f"AORecipeKwargs(module_filter_func={self.module_filter_func!r}): pass a function "
                "(module, fully_qualified_name) -> bool, True for the layers to convert"
            )
        if self.config is None:
            from torchao.float8 import Float8LinearConfig

            if self.pad_inner_dim is None:
                self.pad_inner_dim = _flag("pad_inner_dim", True)
            if self.enable_fsdp_float8_all_gather is None:
                self.enable_fsdp_float8_all_gather = _flag("enable_fsdp_float8_all_gather", True)
            self.config = Float8LinearConfig(
                pad_inner_dim=bool(self.pad_inner_dim),
                enable_fsdp_float8_all_gather=bool(self.enable_fsdp_float8_all_gather),
            )
        else:
            if not hasattr(self.config, "enable_fsdp_float8_all_gather"):
                raise TypeError(
                    f"AORecipeKwargs(config={self.config!r}): pass a torchao.float8.Float8LinearConfig "
                    "(torchao.float8.Float8LinearConfig.from_recipe_name('tensorwise'), say)"
                )
            self.pad_inner_dim = self.config.pad_inner_dim
            self.enable_fsdp_float8_all_gather = self.config.enable_fsdp_float8_all_gather


@dataclasses.dataclass
class TERecipeKwargs(KwargsHandler):
    """TransformerEngine's FP8 recipe (the reference's fields). TransformerEngine needs an NVIDIA GPU and CUDA:
    without the package this raises ImportError, as the reference's does; without a GPU the Accelerator refuses.

        TERecipeKwargs(fp8_format="HYBRID", amax_history_len=16)
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        self._fill_te_fields(type(self).__name__)
        if not is_transformer_engine_available():
            raise ImportError(
                f"{type(self).__name__} needs TransformerEngine (pip install transformer-engine[pytorch], on a machine "
                "with an NVIDIA GPU and CUDA); on a CPU or without it use torchao: "
                "Accelerator(mixed_precision='fp8', kwargs_handlers=[AORecipeKwargs()])"
            )

    def _fill_te_fields(self, owner: str) -> None:
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = _flag("use_autocast_during_eval", False)
        if self.margin is None:
            self.margin = int(fp8_env("margin", 0))
        if self.interval is None:
            self.interval = int(fp8_env("interval", 1))
        self.fp8_format = str(self.fp8_format or fp8_env("format", "HYBRID")).upper()
        _one_of(owner, "fp8_format", self.fp8_format, _FORMATS)
        self.amax_compute_algo = str(
            self.amax_compute_algo or fp8_env("amax_compute_algo", "most_recent")
        ).lower()
        _one_of(owner, "amax_compute_algo", self.amax_compute_algo, _AMAX_ALGOS)
        if self.amax_history_len is None:
            self.amax_history_len = int(fp8_env("amax_history_len", 1024))
        if self.override_linear_precision is None:
            self.override_linear_precision = tuple(  # type: ignore[assignment]
                _flag(f"override_{part}", False) for part in ("fprop", "dgrad", "wgrad")
            )
        if len(tuple(self.override_linear_precision)) != 3:  # type: ignore[arg-type]
            raise ValueError(
                f"{owner}(override_linear_precision={self.override_linear_precision!r}): give three booleans "
                "(fprop, dgrad, wgrad)"
            )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = _flag("use_mxfp8_block_scaling", False)


@dataclasses.dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP's FP8 optimisation level (``opt_level`` "O1" or "O2"). MS-AMP needs an NVIDIA GPU and is not on PyPI:
    the Accelerator refuses it, naming the cause, when the package or a GPU is missing.

        MSAMPRecipeKwargs(opt_level="O1")
    """

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = str(fp8_env("opt_level", "O2"))
        _one_of(type(self).__name__, "opt_level", self.opt_level, _OPT_LEVELS)


@dataclasses.dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated in the reference: the TransformerEngine and MS-AMP fields with ``backend`` ("te" or "msamp").
    Use ``TERecipeKwargs``, ``MSAMPRecipeKwargs`` or, for torchao, ``AORecipeKwargs``."""

    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated (as in the reference, which drops it in 2.0): use TERecipeKwargs, "
            "MSAMPRecipeKwargs or AORecipeKwargs",
            FutureWarning,
            stacklevel=3,
        )
        if self.backend is None:
            self.backend = str(fp8_env("backend", "msamp" if is_msamp_available() else "te"))
        self.backend = str(getattr(self.backend, "value", self.backend)).upper()
        if self.backend not in ("TE", "MSAMP"):
            raise ValueError(
                f"FP8RecipeKwargs(backend={self.backend!r}): backend is 'te' (TransformerEngine) or 'msamp' (MS-AMP); "
                "for torchao pass AORecipeKwargs() instead"
            )
        self._fill_te_fields("FP8RecipeKwargs")
        MSAMPRecipeKwargs.__post_init__(self)
        if self.backend == "TE" and not is_transformer_engine_available():
            TERecipeKwargs.__post_init__(self)  # the ImportError naming TransformerEngine
