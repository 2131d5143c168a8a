"""Apply ``CompileOptions`` to a prepared model: the whole model, or its repeated blocks, with an eager fallback.

torch.compile is lazy: a compiler failure (a backend that raises, no C++ compiler for inductor)
appears at the first call. Every compiled piece of a model is guarded: on such a failure the
model warns once, naming the cause, and runs eagerly from then on (that call included).
``fullgraph=True`` means "fail rather than break the graph": a graph break is raised, with a
note saying so.

    model = compile_model(model, CompileOptions(backend="aot_eager", regional=True))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..accelerator.unwrap import is_compiled_module, strip_parallel
from .options import CompileOptions

__all__ = ["compile_model", "compile_regions", "find_repeated_blocks", "has_compiled_regions"]

_REGIONS = "_accel_nb_compiled_regions"  # on a model whose blocks were compiled in place: the blocks


def _compiler_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the compiler failed" (not "the model's code is wrong")."""
    from torch._dynamo import exc as dynamo_exc

    found: list[type[BaseException]] = [dynamo_exc.BackendCompilerFailed, dynamo_exc.InternalTorchDynamoError]
    try:
        from torch._inductor import exc as inductor_exc
    except ImportError:  # pragma: no cover - torch builds without inductor
        return tuple(found)
    for name in ("InvalidCxxCompiler", "CppCompileError", "TritonMissing", "GPUTooOldForTriton"):
        kind = getattr(inductor_exc, name, None)
        if isinstance(kind, type):
            found.append(kind)
    return tuple(found)


def _cause(exc: BaseException) -> str:
    """The error behind a compiler failure, in one line (the backend's own exception when torch kept it)."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
    lines = [line for line in str(inner).strip().splitlines() if line.strip()]
    return f"{type(inner).__name__}: {lines[0] if lines else ''}".strip()


class _EagerFallback:
    """Shared by the compiled pieces of one model: the first compiler failure makes all of them eager."""

    def __init__(self, what: str, options: CompileOptions) -> None:
        self.what, self.options = what, options
        self.failed: BaseException | None = None
        self.undo: list[Callable[[], None]] = []  # each turns one piece back to eager

    def guard(self, compiled_call: Callable[..., Any], eager_call: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled_call``, running ``eager_call`` instead once compiling failed."""
        errors = _compiler_errors()

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failed is not None:
                return eager_call(*args, **kwargs)
            try:
                return compiled_call(*args, **kwargs)
            except errors as exc:
                if not self.options.fallback:
                    exc.add_note(
                        "accel_nb: CompileOptions(fallback=False) raises compiler failures; "
                        "fallback=True would run the model eagerly with a warning"
                    )
                    raise
                self._fall_back(exc)
                return eager_call(*args, **kwargs)
            except Exception as exc:
                if self.options.fullgraph and _is_graph_break(exc):
                    exc.add_note(
                        "accel_nb: compile fullgraph=True makes a graph break an error; pass "
                        "fullgraph=False to let torch.compile split the graph there"
                    )
                raise

        return call

    def _fall_back(self, exc: BaseException) -> None:
        self.failed = exc
        for undo in self.undo:
            undo()
        warnings.warn(
            f"torch.compile (backend={self.options.backend_label!r}) failed for {self.what}: {_cause(exc)}. "
            "It runs eagerly (uncompiled) from now on; fix the cause, or pass compile=False to skip compiling "
            "(CompileOptions(fallback=False) raises instead)",
            UserWarning,
            stacklevel=4,
        )


def _is_graph_break(exc: BaseException) -> bool:
    from torch._dynamo import exc as dynamo_exc

    return isinstance(exc, (dynamo_exc.Unsupported, dynamo_exc.UserError))


def _traced_entry(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` behind a frame of accel_nb's, which dynamo traces (inlining ``call``).

    ``block.compile()`` hands dynamo ``Module._call_impl`` itself, a frame of torch.nn that dynamo
    skips for torch's own classes: an ``nn.TransformerEncoderLayer`` block would run uncompiled.
    """

    def entry(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    return entry


def find_repeated_blocks(model: nn.Module, block_class: type | str | None = None) -> list[nn.Module]:
    """The instances of the block class regional compilation compiles (empty when there is none).

    Without ``block_class``: the class repeated in an ``nn.ModuleList`` (every entry of that class,
    at least two) whose instances hold the most parameters together.

        find_repeated_blocks(gpt2)   # the 12 GPT2Block modules
    """
    if block_class is not None:
        if isinstance(block_class, str):
            return [m for m in model.modules() if type(m).__name__ == block_class]
        return [m for m in model.modules() if isinstance(m, block_class)]
    sizes: dict[type, int] = {}
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            kind = type(module[0])
            if all(type(m) is kind for m in module):
                sizes[kind] = sizes.get(kind, 0) + sum(p.numel() for m in module for p in m.parameters())
    if not sizes:
        return []
    largest = max(sizes, key=lambda k: sizes[k])
    return [m for m in model.modules() if type(m) is largest]


def has_compiled_regions(module: nn.Module) -> bool:
    """True when regional compilation compiled blocks of ``module`` (or a module inside it) in place."""
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def compile_regions(
    module: nn.Module, options: CompileOptions | None = None, **compile_kwargs: Any
) -> nn.Module:
    """Compile each repeated block of ``module`` in place (as ``block.compile()`` does) and return ``module``
    (the reference's parameter name, for keyword callers).

    Every block runs the same code, so torch compiles it once and reuses it for the others.
    Parameter names do not change (checkpoints stay plain). ``compile_kwargs`` (the reference's
    spelling: ``backend=``, ``mode=``...) build a CompileOptions when none is given.

        model = compile_regions(model, backend="aot_eager")
    """
    model = module
    options = options if options is not None else CompileOptions(regional=True, **compile_kwargs)
    options.check_backend()
    inner = strip_parallel(model._orig_mod if is_compiled_module(model) else model)
    blocks = find_repeated_blocks(inner, options.block_class)
    if not blocks:
        if options.block_class is not None:
            name = getattr(options.block_class, "__name__", options.block_class)
            raise ValueError(
                f"regional compilation: {type(inner).__name__} contains no {name} module; name a "
                "block class the model holds (block_class=...) or pass regional=False"
            )
        raise ValueError(
            f"regional compilation: {type(inner).__name__} has no block class repeated in an nn.ModuleList; name "
            "its block class (CompileOptions(block_class=...)) or compile the whole model (regional=False)"
        )
    _compile_in_place(blocks, options, f"{type(inner).__name__} (its {type(blocks[0]).__name__} blocks)")
    setattr(inner, _REGIONS, True)
    return model


def _compile_in_place(modules: list[nn.Module], options: CompileOptions, what: str) -> None:
    """Compile each module's call in place (its ``_compiled_call_impl``, as ``module.compile()`` does), guarded."""
    fallback = _EagerFallback(what, options)
    kwargs = options.torch_compile_kwargs()
    for module in modules:
        compiled = torch.compile(_traced_entry(module._call_impl), **kwargs)
        module._compiled_call_impl = fallback.guard(compiled, module._call_impl)
        fallback.undo.append(lambda m=module: setattr(m, "_compiled_call_impl", None))


def compile_model(model: nn.Module, options: CompileOptions, in_place: bool = False) -> nn.Module:
    """``model`` compiled as ``options`` say: the whole (an OptimizedModule around it) or its blocks in place.

    Call it before DDP wraps the model: torch recommends compiling the module inside the wrapper
    (dynamo skips DDP's forward, and with it the forward of torch's own container classes).
    ``in_place=True`` compiles the whole model in place instead (FSDP: the prepared model stays
    the sharded module). A model that is compiled already (by the user) is returned as it is.

        compiled = compile_model(ddp_model, CompileOptions(backend="eager"))
    """
    if is_compiled_module(model) or has_compiled_regions(model):
        warnings.warn(
            f"{type(model).__name__} is compiled already; prepare() does not compile it again",
            UserWarning,
            stacklevel=3,
        )
        return model
    if options.regional:
        inner = strip_parallel(model)
        if options.block_class is not None or find_repeated_blocks(inner):
            return compile_regions(model, options)
        warnings.warn(
            f"regional compilation: {type(inner).__name__} has no block class repeated in an nn.ModuleList, so "
            "the whole model is compiled (name its block with CompileOptions(block_class=...))",
            UserWarning,
            stacklevel=3,
        )
    options.check_backend()
    if in_place:
        _compile_in_place([model], options, type(model).__name__)
        return model
    compiled = torch.compile(model, **options.torch_compile_kwargs())
    eager = model.__call__
    fallback = _EagerFallback(type(strip_parallel(model)).__name__, options)
    compiled.forward = fallback.guard(compiled.forward, eager)
    fallback.undo.append(lambda: setattr(compiled, "forward", eager))
    return compiled
