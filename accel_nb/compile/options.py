"""What ``Accelerator(compile=...)`` asks of torch.compile: the options, their checks, where they come from.

Three spellings lead here: ``compile=True`` / ``compile=CompileOptions(...)`` (accel_nb's),
``dynamo_backend="inductor"`` / ``dynamo_plugin=TorchDynamoPlugin(...)`` (the reference
library's), and the launch config's ``dynamo_config`` (it reaches each rank as
``ACCEL_NB_DYNAMO_*`` environment variables, the reference's ``ACCELERATE_DYNAMO_*`` are read
too). Applying the options to a model is :mod:`accel_nb.compile.apply`.

    options = resolve_compile_options(compile=CompileOptions(backend="aot_eager", regional=True))
    options.torch_compile_kwargs()   # {'backend': 'aot_eager', 'fullgraph': False, 'dynamic': None}
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
from collections.abc import Callable
from typing import Any

from ..env_names import DYNAMO_ENV  # option -> (accel_nb's variable, the reference's); launchers set both
from ..kwargs_handlers import KwargsHandler

__all__ = [
    "CompileOptions",
    "DynamoBackend",
    "TorchDynamoPlugin",
    "compile_options_from_env",
    "resolve_compile_options",
    "DYNAMO_MODES",
]

DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_TRUE, _FALSE = ("1", "true", "t", "yes", "y", "on"), ("0", "false", "f", "no", "n", "off")  # the reference's


class DynamoBackend(str, enum.Enum):
    """The reference library's backend names (its config files write them in capitals)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"


def _backend_name(value: Any) -> Any:
    """A backend as torch.compile spells it: lower-case text, or the callable itself."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return value.strip().lower()
    if callable(value):
        return value
    raise TypeError(f"backend={value!r} must be a backend name such as 'inductor' or a callable compiler")


def _flag(name: str, value: Any, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(
            f"CompileOptions({name}={value!r}): {name} must be True or False"
            + (" (or None)" if allow_none else "")
        )
    return value


@dataclasses.dataclass
class CompileOptions:
    """How ``prepare`` compiles each model with torch.compile.

    ``backend``, ``mode``, ``fullgraph``, ``dynamic`` and ``options`` are torch.compile's.
    ``regional=True`` compiles only the repeated blocks (one code object reused by every block:
    a shorter cold start), ``block_class`` names that class (a class or its name; default: the
    largest class repeated in an ``nn.ModuleList``). ``fallback=True`` turns a compiler failure
    at the first call into a warning and an eager run; ``False`` raises it.

        Accelerator(compile=CompileOptions(backend="inductor", regional=True))
    """

    backend: str | Callable[..., Any] = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    regional: bool = False
    block_class: type | str | None = None
    fallback: bool = True

    def __post_init__(self) -> None:
        self.backend = _backend_name(self.backend)
        if self.backend == "no":
            raise ValueError("CompileOptions(backend='no') compiles nothing: pass compile=False instead")
        if self.mode == "default":
            self.mode = None
        if self.mode is not None and self.mode not in DYNAMO_MODES:
            raise ValueError(
                f"CompileOptions(mode={self.mode!r}) is not a torch.compile mode; use one of "
                + ", ".join(repr(m) for m in DYNAMO_MODES)
            )
        self.fullgraph = _flag("fullgraph", self.fullgraph)
        self.dynamic = _flag("dynamic", self.dynamic, allow_none=True)
        self.regional = _flag("regional", self.regional)
        self.fallback = _flag("fallback", self.fallback)
        if self.options is not None and not isinstance(self.options, dict):
            raise TypeError(f"CompileOptions(options={self.options!r}) must be a dict of backend options")
        if self.options and self.mode is not None:
            raise ValueError(
                f"CompileOptions: mode={self.mode!r} and options= cannot be given together (torch.compile takes "
                "one or the other); put the mode's settings in options, or drop options"
            )
        if self.block_class is not None:
            if not self.regional:
                raise ValueError(
                    "CompileOptions(block_class=...) picks the block of regional compilation: "
                    "pass regional=True with it"
                )
            if not isinstance(self.block_class, (str, type)):
                raise TypeError(
                    f"CompileOptions(block_class={self.block_class!r}) must be a module class or its name"
                )
        if (self.mode is not None or self.options) and self.backend != "inductor":
            what = f"mode={self.mode!r}" if self.mode is not None else "options="
            raise ValueError(
                f"CompileOptions: {what} is for the inductor backend; backend {self.backend_label!r} takes none. "
                "Drop it, or use backend='inductor'"
            )

    @property
    def backend_label(self) -> str:
        """The backend's name (a callable's function name)."""
        return (
            self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "callable")
        )

    def check_backend(self) -> None:
        """Raise a clear error when torch has no backend of this name (imports ``torch._dynamo``: at prepare time)."""
        if not isinstance(self.backend, str):
            return
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if self.backend not in known:
            usual = [b for b in ("inductor", "aot_eager", "eager", "cudagraphs") if b in known]
            raise ValueError(
                f"torch.compile backend {self.backend!r} is not available in this torch "
                f"({torch.__version__}); use one of {', '.join(usual)} (all: torch._dynamo.list_backends())"
            )

    def torch_compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile`` / ``module.compile``."""
        kwargs: dict[str, Any] = {
            "backend": self.backend,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
        }
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs


@dataclasses.dataclass
class TorchDynamoPlugin(KwargsHandler):
    """The reference library's compile settings (``Accelerator(dynamo_plugin=...)``).

    As in the reference, a field left at ``None`` is filled at construction from the launch
    config's ``ACCEL_NB_DYNAMO_*`` (or the reference's ``ACCELERATE_DYNAMO_*``) environment
    variables, else the reference's default: ``backend`` becomes a ``DynamoBackend``
    (``DynamoBackend.NO`` when unset), ``mode`` ``"default"``, ``fullgraph`` and
    ``use_regional_compilation`` ``False``; ``dynamic`` stays ``None`` unless the variable is set.
    ``disable=True`` compiles nothing.

        Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor", use_regional_compilation=True))
    """

    backend: Any = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        self._fill_from(_env_settings())

    def _fill_from(self, env: dict[str, Any]) -> None:
        if self.backend is None:
            self.backend = env.get("backend", "no")
        if isinstance(self.backend, str):
            # the reference's enum for its names; another registered torch backend stays a string
            self.backend = DynamoBackend.__members__.get(self.backend.strip().upper(), self.backend)
        if self.mode is None:
            self.mode = env.get("mode", "default")
        if self.fullgraph is None:
            self.fullgraph = env.get("fullgraph", False)
        if self.use_regional_compilation is None:
            self.use_regional_compilation = env.get("regional", False)
        if self.dynamic is None:
            self.dynamic = env.get("dynamic")

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``backend`` as the lower-case name ``torch.compile`` takes (as the reference gives it)."""
        values = super().to_dict()
        if isinstance(values["backend"], DynamoBackend):
            values["backend"] = values["backend"].value.lower()
        return values

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from the defaults with no ``*_DYNAMO_*`` variable set (so what the
        environment filled in counts), without ``use_regional_compilation``, as in the reference."""
        default = copy.copy(self)  # not a constructor call: that would read the environment
        for f in dataclasses.fields(self):
            setattr(default, f.name, f.default)
        default._fill_from({})
        defaults = default.to_dict()
        kwargs = {k: v for k, v in self.to_dict().items() if defaults[k] != v}
        kwargs.pop("use_regional_compilation", None)
        return kwargs

    def to_compile_options(self) -> CompileOptions | None:
        """The CompileOptions these settings mean (None: no compilation)."""
        if self.disable or _backend_name(self.backend) == "no":
            return None
        return CompileOptions(
            backend=self.backend,
            mode=self.mode,
            fullgraph=self.fullgraph,
            dynamic=self.dynamic,
            options=self.options,
            regional=self.use_regional_compilation,
        )


def _env_bool(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"the environment variable {name}={raw!r} must be true or false")


def _env_settings() -> dict[str, Any]:
    """The compile settings the launch environment holds (only those that are set)."""
    found: dict[str, Any] = {}
    for option, names in DYNAMO_ENV.items():
        name = next((n for n in names if os.environ.get(n, "") != ""), None)
        if name is None:
            continue
        raw = os.environ[name]
        found[option] = (
            _env_bool(name, raw) if option in ("fullgraph", "dynamic", "regional") else raw.lower()
        )
    return found


def compile_options_from_env() -> CompileOptions | None:
    """The launch config's compile settings as the launcher put them in the environment (None: no compile)."""
    return TorchDynamoPlugin().to_compile_options()


def resolve_compile_options(
    compile: bool | CompileOptions | None = None, dynamo_backend: Any = None, dynamo_plugin: Any = None
) -> CompileOptions | None:
    """The one compile setting of an Accelerator: its arguments first, else the launch environment.

    resolve_compile_options(compile=True)               # CompileOptions() (inductor)
    resolve_compile_options(dynamo_backend="eager")     # CompileOptions(backend='eager')
    resolve_compile_options(compile=False)              # None, whatever the launch config says
    """
    given = [
        n
        for n, v in (
            ("compile", compile),
            ("dynamo_backend", dynamo_backend),
            ("dynamo_plugin", dynamo_plugin),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise ValueError(
            f"Accelerator: pass only one of {' and '.join(given)}; they all set torch.compile "
            "(compile=CompileOptions(...) holds every setting)"
        )
    if compile is True:
        return CompileOptions()
    if compile is False:
        return None
    if isinstance(compile, CompileOptions):
        return compile
    if compile is not None:
        raise TypeError(f"Accelerator(compile={compile!r}) must be True, False or a CompileOptions")
    if dynamo_backend is not None:
        return TorchDynamoPlugin(backend=dynamo_backend).to_compile_options()
    if dynamo_plugin is not None:
        if isinstance(dynamo_plugin, TorchDynamoPlugin):
            return dynamo_plugin.to_compile_options()
        if isinstance(dynamo_plugin, CompileOptions):
            return dynamo_plugin
        fields = ("backend", "mode", "fullgraph", "dynamic", "options", "disable", "use_regional_compilation")
        if type(dynamo_plugin).__name__ == "TorchDynamoPlugin":  # the reference library's own class
            values = {f: getattr(dynamo_plugin, f, None) for f in fields}
            return TorchDynamoPlugin(**values).to_compile_options()
        raise TypeError(f"dynamo_plugin={dynamo_plugin!r} must be a TorchDynamoPlugin (from accel_nb.utils)")
    return compile_options_from_env()
