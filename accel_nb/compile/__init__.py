"""torch.compile behind ``Accelerator.prepare``: what ``Accelerator(compile=...)`` asks, and applying it to a model.

- ``options``: ``CompileOptions``, the reference's ``TorchDynamoPlugin`` / ``DynamoBackend``, and the
  launch config's ``dynamo_config`` as environment variables (no torch at import)
- ``apply``: compile a prepared model whole or by its repeated blocks, with an eager fallback

Names resolve lazily, so the launch config reads the options without importing torch.

    from accel_nb.compile import CompileOptions, compile_regions
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ["CompileOptions", "DynamoBackend", "TorchDynamoPlugin", "resolve_compile_options"], ".options"
    ),
    **dict.fromkeys(
        ["compile_model", "compile_regions", "find_repeated_blocks", "has_compiled_regions"], ".apply"
    ),
}

__all__ = [
    "CompileOptions",
    "DynamoBackend",
    "TorchDynamoPlugin",
    "compile_model",
    "compile_regions",
    "find_repeated_blocks",
    "has_compiled_regions",
    "resolve_compile_options",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .apply import compile_model, compile_regions, find_repeated_blocks, has_compiled_regions
    from .options import CompileOptions, DynamoBackend, TorchDynamoPlugin, resolve_compile_options
