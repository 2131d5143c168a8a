"""What ``accel-nb migrate --check`` reports, and how it finds names: a ``Finding``, accel_nb's object at
an imported dotted path (``resolve``), why a name is left out (``left_out_reason``), small ``ast`` readers.

Split from ``migrate_checker`` (the walk over a script) so that each module stays short.
"""

from __future__ import annotations

import ast
import importlib
import types
from dataclasses import dataclass
from typing import Any

from .migrate_data import LEFT_OUT

__all__ = [
    "MISSING",
    "UNKNOWN",
    "ROOTS",
    "Finding",
    "attribute_position",
    "catches_import_error",
    "dotted",
    "label",
    "left_out_reason",
    "literal",
    "resolve",
]

MISSING = object()
UNKNOWN = object()
ROOTS = ("accelerate", "accel_nb")  # the imports checked: the reference's name, and accel_nb's own


@dataclass(frozen=True)
class Finding:
    """One report line: ``where`` is ``file:line:column`` (``file:cell N:line L:col C`` in a notebook), the
    place of the call, attribute, keyword or import the message is about; ``line``/``column`` (1-based)
    are that place in the file (in the joined code cells of a notebook)."""

    where: str
    severity: str  # "error" (would fail under accel_nb) or "note" (runs, but differs or warns)
    message: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        return f"{self.where}: {self.severity}: {self.message}"


def left_out_reason(parts: list[str]) -> str | None:
    """Why ``accelerate.<parts>`` is deliberately not under accel_nb (LEFT_OUT: migrate_data)."""
    if len(parts) == 1 and parts[0] in LEFT_OUT and not parts[0].islower():
        return LEFT_OUT[parts[0]]  # a name the reference's top level re-exports (ParallelismConfig)
    if len(parts) < 2:
        return None
    if parts[0] != "utils":  # a top-level module (accelerate.<module>.name): keyed "<module>.name"
        if f"{parts[0]}.{parts[1]}" in LEFT_OUT:
            return LEFT_OUT[f"{parts[0]}.{parts[1]}"]
        parts = ["utils", parts[1]]  # a name it imports: left out for its home's reason, found below
    if len(parts) >= 3 and parts[1] in LEFT_OUT:
        return LEFT_OUT[parts[1]]
    if len(parts) >= 3 and f"{parts[1]}.{parts[2]}" in LEFT_OUT:
        return LEFT_OUT[f"{parts[1]}.{parts[2]}"]
    name = parts[1]
    if name in LEFT_OUT:
        return LEFT_OUT[name]
    for key, reason in LEFT_OUT.items():
        if key.rsplit(".", 1)[-1] == name and "." in key:
            return reason
    return None


_cache: dict[tuple[str, ...], Any] = {}


def resolve(parts: list[str]) -> tuple[Any, int]:
    """accel_nb's object at ``accel_nb.<parts>``: (object, len(parts)), or (MISSING, index of the first
    part that is absent). Stops at the first non-module object (its attributes are not looked up)."""
    key = tuple(parts)
    if key in _cache:
        return _cache[key]
    obj: Any = importlib.import_module("accel_nb")
    path = "accel_nb"
    result: tuple[Any, int] | None = None
    for i, part in enumerate(parts):
        if not isinstance(obj, types.ModuleType):
            break  # a class or a function: its attributes are not looked up
        path = f"{path}.{part}"
        try:
            found = getattr(obj, part, MISSING)
        except Exception:  # a lazy export whose optional dependency is missing here
            found = MISSING
        if found is MISSING:
            try:
                found = importlib.import_module(path)
            except Exception:  # no such module (or it cannot import here)
                result = (MISSING, i)
                break
        obj = found
    if result is None:
        result = (obj, len(parts))
    _cache[key] = result
    return result


def label(obj: Any) -> str:
    return getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))


def literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN


def dotted(node: ast.AST | None) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else (a call, a subscript...)."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
        return names[::-1]
    return None


def attribute_position(node: ast.AST) -> tuple[int, int]:
    """(line, 0-based column) of an attribute's own name (``foo`` in ``self.accelerator.foo``), else the
    node's start."""
    if isinstance(node, ast.Attribute) and node.end_lineno is not None and node.end_col_offset is not None:
        return node.end_lineno, max(node.end_col_offset - len(node.attr), 0)
    return getattr(node, "lineno", 1), getattr(node, "col_offset", 0)


def catches_import_error(kind: ast.AST | None) -> bool:
    """Whether an ``except`` clause's type catches an ImportError (bare, ImportError, Exception, a tuple of those)."""
    if kind is None:
        return True
    if isinstance(kind, ast.Tuple):
        return any(catches_import_error(item) for item in kind.elts)
    name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", None)
    return name in {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
