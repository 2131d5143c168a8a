"""Module attributes resolved on first use: the one mechanism behind every lazy re-export.

    _EXPORTS = {"Accelerator": ".accelerator"}          # name -> module that defines it
    __getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

A name is imported from its module the first time it is read and then cached in the module's
namespace, so later reads are plain dictionary hits and ``import`` of the re-exporting module
stays cheap (``import accel_nb`` does not import torch's heavier parts, IPython or ipywidgets).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a module whose ``exports`` map names to defining modules.

    Relative module names (``".state"``) resolve against the module's own package.
    """
    module_name = namespace["__name__"]
    package = namespace.get("__package__") or module_name

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(source, package), name)
        except AttributeError as exc:  # ``from pkg import name`` would turn it into "cannot import name"
            raise ImportError(f"{module_name}.{name} could not be loaded from {source}: {exc}") from exc
        namespace[name] = value  # cache: the next lookup is a plain dict hit
        return value

    def __dir__() -> list[str]:
        public = {k for k in namespace if not k.startswith("_")}
        return sorted(public | set(exports))

    return __getattr__, __dir__
