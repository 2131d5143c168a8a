"""``accel-nb migrate --check PATH``: what a script written for accelerate would hit under accel_nb.

    accel-nb migrate --check train.py          # one script
    accel-nb migrate --check src/              # every .py and .ipynb under a folder
    accel-nb migrate --check notebook.ipynb    # the code cells of a notebook

The user's files are read, never imported, run or written: each is parsed (``ast``), its ``accelerate``
imports are renamed to ``accel_nb`` in memory, and each imported name is looked up under the same dotted
path of accel_nb. Reported, per ``file:line``: names accel_nb lacks (with the reason when they are left out
on purpose), keywords that the accel_nb object refuses (read from its signature) or warns about, calls on
an ``Accelerator`` instance that accel_nb's lacks, and every deliberate difference the code touches
(``migrate_data``). Exit status: 0 nothing blocks, 1 something would fail, 2 bad input.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

from .migrate_data import (
    DIFFERENCES,
    FORWARDS_KEYWORDS_TO,
    KEYWORD_RULES,
    LAUNCHER_REFERENCE_OPTIONS,
    LEFT_OUT,
)

__all__ = ["Finding", "add_parser", "check_path", "check_source", "run"]

_MISSING = object()
_UNKNOWN = object()
_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".ipynb_checkpoints", ".tox"}


@dataclass(frozen=True)
class Finding:
    """One report line: ``where`` is ``file:line`` (``file:cell N:line`` in a notebook)."""

    where: str
    severity: str  # "error" (would fail under accel_nb) or "note" (runs, but differs or warns)
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.severity}: {self.message}"


class BadInput(Exception):
    """The path is missing, unreadable, or not Python (exit status 2)."""


def _left_out_reason(parts: list[str]) -> str | None:
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


def _resolve(parts: list[str]) -> tuple[Any, int]:
    """accel_nb's object at ``accel_nb.<parts>``: (object, len(parts)), or (_MISSING, index of the first
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
            found = getattr(obj, part, _MISSING)
        except Exception:  # a lazy export whose optional dependency is missing here
            found = _MISSING
        if found is _MISSING:
            try:
                found = importlib.import_module(path)
            except Exception:  # no such module (or it cannot import here)
                result = (_MISSING, i)
                break
        obj = found
    if result is None:
        result = (obj, len(parts))
    _cache[key] = result
    return result


def _label(obj: Any) -> str:
    return getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else (a call, a subscript...)."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
        return names[::-1]
    return None


def _catches_import_error(kind: ast.AST | None) -> bool:
    """Whether an ``except`` clause's type catches an ImportError (bare, ImportError, Exception, a tuple of those)."""
    if kind is None:
        return True
    if isinstance(kind, ast.Tuple):
        return any(_catches_import_error(item) for item in kind.elts)
    name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", None)
    return name in {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


class _Checker(ast.NodeVisitor):
    def __init__(self, where: Any) -> None:
        self.where = where  # lineno -> "file:line"
        self.findings: list[Finding] = []
        self.bound: dict[str, list[str]] = {}  # local name -> parts after "accelerate"
        self.accelerators: set[str] = set()  # dotted names bound to an Accelerator(...) instance
        self.noted: set[tuple[str, str]] = set()
        self.guard: str | None = (
            None  # why an import here may never run (an `if`, a `try` catching ImportError)
        )
        self.importing = False
        import accel_nb  # deferred: the checker needs accel_nb only when it runs

        self.accelerator_class = accel_nb.Accelerator

    def add(self, node: ast.AST, severity: str, message: str) -> None:
        if severity == "error" and self.importing and self.guard:
            severity, message = "note", f"{message}; {self.guard}"
        finding = Finding(self.where(getattr(node, "lineno", 1)), severity, message)
        if finding not in self.findings:
            self.findings.append(finding)

    # -- names ------------------------------------------------------------------------------------------
    def missing(self, node: ast.AST, parts: list[str], upto: int) -> None:
        parent = ".".join(["accel_nb", *parts[:upto]])
        reason = _left_out_reason(parts[: upto + 1] + parts[upto + 1 : upto + 2])
        if reason is None and upto + 1 < len(parts):
            reason = _left_out_reason(parts)
        ref = "accelerate." + ".".join(parts)
        if reason:
            self.add(node, "error", f"`{ref}` is left out of accel_nb on purpose: {reason}")
        else:
            self.add(
                node,
                "error",
                f"`{ref}`: accel_nb has no `{parts[upto]}` in `{parent}` (not provided yet; see docs/migration.md)",
            )

    def touch(self, node: ast.AST, name: str) -> None:
        for diff in DIFFERENCES:
            if diff.name == name and (name, self.where(node.lineno)) not in self.noted:
                self.noted.add((name, self.where(node.lineno)))
                self.add(
                    node,
                    "note",
                    f"`{name}` differs on purpose: {diff.message} (docs/migration.md: {diff.anchor})",
                )

    def check_parts(self, node: ast.AST, parts: list[str]) -> Any:
        obj, upto = _resolve(parts)
        if obj is _MISSING:
            self.missing(node, parts, upto)
            return _MISSING
        if not isinstance(obj, types.ModuleType):
            self.touch(node, _label(obj))
        return obj

    # -- imports that may never run: reported as notes, they fail only when they run ---------------------
    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        outer = self.guard
        self.guard = f"it is inside the `if` of line {node.lineno}, so it fails only when that branch runs"
        for child in [*node.body, *node.orelse]:
            self.visit(child)
        self.guard = outer

    def visit_Try(self, node: ast.Try) -> None:
        outer = self.guard
        if any(_catches_import_error(handler.type) for handler in node.handlers):
            self.guard = f"the `try` of line {node.lineno} catches the ImportError"
        for child in node.body:
            self.visit(child)
        self.guard = outer
        for child in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(child)

    visit_TryStar = visit_Try

    def visit_Import(self, node: ast.Import) -> None:
        self.importing = True
        try:
            self.check_import(node)
        finally:
            self.importing = False

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.importing = True
        try:
            self.check_import_from(node)
        finally:
            self.importing = False

    def check_import(self, node: ast.Import) -> None:
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] != "accelerate":
                continue
            self.check_parts(node, parts[1:])
            if alias.asname:
                self.bound[alias.asname] = parts[1:]
            else:
                self.bound["accelerate"] = []

    def check_import_from(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        parts = node.module.split(".")
        if parts[0] != "accelerate":
            return
        if self.check_parts(node, parts[1:]) is _MISSING:
            return
        for alias in node.names:
            if alias.name == "*":
                self.add(node, "note", f"`from {node.module} import *`: names used from it are not checked")
                continue
            self.bound[alias.asname or alias.name] = [*parts[1:], alias.name]
            self.check_parts(node, [*parts[1:], alias.name])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        if dotted and dotted[0] in self.bound:
            self.check_parts(node, self.bound[dotted[0]] + dotted[1:])
            return  # the inner attributes are part of this chain
        self.generic_visit(node)

    # -- calls ------------------------------------------------------------------------------------------
    def callee(self, func: ast.AST) -> tuple[Any, str | None]:
        dotted = _dotted(func)
        if not dotted:
            return None, None
        if dotted[0] in self.bound:
            obj, _ = _resolve(self.bound[dotted[0]] + dotted[1:])
            return (
                (None, None) if obj is _MISSING or isinstance(obj, types.ModuleType) else (obj, _label(obj))
            )
        owner = ".".join(dotted[:-1])
        if len(dotted) > 1 and owner in self.accelerators:
            method = dotted[-1]
            found = getattr(self.accelerator_class, method, _MISSING)
            if found is _MISSING:
                self.add(func, "error", f"accel_nb's Accelerator has no `{method}` (`{owner}.{method}(...)`)")
                return None, None
            self.touch(func, f"Accelerator.{method}")
            return found, f"Accelerator.{method}"
        return None, None

    def rebind(self, name: str) -> None:
        """A later def/class/assignment of an imported name: it no longer means accelerate's object."""
        self.bound.pop(name, None)

    def is_accelerator(self, node: ast.AST | None) -> bool:
        """``Accelerator`` (imported from accelerate), as an annotation or the callee of an assignment."""
        if node is None:
            return False
        dotted = _dotted(node)
        if not dotted or dotted[0] not in self.bound:
            return False
        obj, _ = _resolve(self.bound[dotted[0]] + dotted[1:])
        return obj is self.accelerator_class

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        if not isinstance(node, ast.ClassDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if self.is_accelerator(arg.annotation):
                    self.accelerators.add(arg.arg)
        self.generic_visit(node)
        self.rebind(node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id in self.bound:
                self.generic_visit(node)
                self.rebind(target.id)
                return
        if isinstance(node.value, ast.Call):
            obj, label = self.callee(node.value.func)
            if obj is self.accelerator_class:
                for target in node.targets:
                    dotted = _dotted(target)
                    if dotted:
                        self.accelerators.add(".".join(dotted))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        dotted = _dotted(node.target)
        value = node.value.func if isinstance(node.value, ast.Call) else None
        if dotted and (self.is_accelerator(node.annotation) or self.is_accelerator(value)):
            self.accelerators.add(".".join(dotted))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        obj, label = self.callee(node.func)
        if obj is not None and label is not None and callable(obj):
            self.check_keywords(node, obj, label)
        self.generic_visit(node)

    def check_keywords(self, node: ast.Call, obj: Any, label: str) -> None:
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            signature = None
        given = {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
        if signature is not None:
            params = signature.parameters
            accepted = {
                n
                for n, p in params.items()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"
            }
            open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
            if label == "notebook_launcher":
                from ..launch.options import LaunchOptions  # deferred: only a launcher call needs its options

                accepted |= set(LaunchOptions.names()) | LAUNCHER_REFERENCE_OPTIONS
                open_ended = False
            elif label == "Accelerator":
                open_ended = False  # its **kwargs only catch the reference's other arguments to refuse them
            elif open_ended and label in FORWARDS_KEYWORDS_TO:
                module, _, name = FORWARDS_KEYWORDS_TO[label].partition(":")
                target = inspect.signature(getattr(importlib.import_module(module), name)).parameters
                accepted |= {
                    n
                    for n, p in list(target.items())[1:]
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                }
                open_ended = any(p.kind is p.VAR_KEYWORD for p in target.values())
            if not open_ended:
                for name in given:
                    if name not in accepted:
                        self.add(
                            node,
                            "error",
                            f"`{label}(...)` is given `{name}=`, which accel_nb's {label} does not take "
                            f"(it takes: {', '.join(sorted(accepted)) or 'no keywords'})",
                        )
        for rule in KEYWORD_RULES:
            if rule.callee != label:
                continue
            value_node = given.get(rule.keyword)
            if value_node is None and rule.position is not None:
                args = [a for a in node.args if not isinstance(a, ast.Starred)]
                if len(args) > rule.position:
                    value_node = args[rule.position]
            if value_node is None:
                continue
            value = _literal(value_node)
            if value is _UNKNOWN:
                if rule.severity == "error":
                    self.add(
                        node, "note", f"`{label}({rule.keyword}=...)`: if not the default, {rule.message}"
                    )
                continue
            if rule.matches(value):
                self.add(node, rule.severity, f"`{label}({rule.keyword}={value!r})`: {rule.message}")


def check_source(source: str, where: Any) -> list[Finding]:
    """Findings for one piece of Python source; ``where(lineno)`` names the place. SyntaxError propagates."""
    tree = ast.parse(source)
    checker = _Checker(where)
    checker.visit(tree)
    return checker.findings


def _notebook_source(path: str) -> tuple[str, list[tuple[int, int]]]:
    """The code cells joined, IPython magics and shell lines blanked; and for each line (cell, line)."""
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{path}: not a readable notebook ({exc})") from exc
    lines: list[str] = []
    places: list[tuple[int, int]] = []
    for index, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        text = "".join(src) if isinstance(src, list) else str(src)
        cell_lines = text.splitlines()
        magic_cell = bool(cell_lines) and cell_lines[0].lstrip().startswith("%%")
        for number, line in enumerate(cell_lines, 1):
            stripped = line.lstrip()
            if magic_cell or stripped.startswith(("%", "!", "?")) or stripped.endswith("?"):
                line = ""
            lines.append(line)
            places.append((index, number))
    return "\n".join(lines) + "\n", places


def _files(path: str) -> list[str]:
    if not os.path.exists(path):
        raise BadInput(f"{path}: no such file or folder; give a .py script, a .ipynb notebook or a folder")
    if os.path.isfile(path):
        if not path.endswith((".py", ".ipynb")):
            raise BadInput(f"{path}: not a .py script or a .ipynb notebook; give one of those or a folder")
        return [path]
    found = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        found += [os.path.join(root, n) for n in sorted(names) if n.endswith((".py", ".ipynb"))]
    if not found:
        raise BadInput(f"{path}: the folder holds no .py or .ipynb file to check")
    return found


def check_file(path: str) -> list[Finding]:
    """Findings for one .py or .ipynb file; BadInput when it cannot be read or parsed."""
    if path.endswith(".ipynb"):
        source, places = _notebook_source(path)

        def where(lineno: int) -> str:
            cell, line = places[min(lineno, len(places)) - 1] if places else (0, lineno)
            return f"{path}:cell {cell}:line {line}"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path}: cannot be read ({exc})") from exc

        def where(lineno: int) -> str:
            return f"{path}:{lineno}"

    try:
        return check_source(source, where)
    except SyntaxError as exc:
        raise BadInput(
            f"{where(exc.lineno or 1)}: not valid Python ({exc.msg}); fix it and check again"
        ) from exc


def check_path(path: str) -> tuple[list[Finding], list[str], list[str]]:
    """(findings, files checked, bad-input messages) for a file or a folder."""
    files = _files(path)
    findings: list[Finding] = []
    bad: list[str] = []
    for file in files:
        try:
            findings += check_file(file)
        except BadInput as exc:
            bad.append(str(exc))
    return findings, files, bad


def add_parser(sub: Any) -> None:
    """The ``migrate`` subcommand of the ``accel-nb`` parser."""
    migrate = sub.add_parser(
        "migrate",
        help="check a script, notebook or folder written for accelerate: what accel_nb lacks or does differently",
    )
    migrate.add_argument(
        "--check",
        metavar="PATH",
        required=True,
        help="a .py script, a .ipynb notebook or a folder (read only: nothing is imported, run or written)",
    )


def run(ns: argparse.Namespace) -> int:
    """``accel-nb migrate --check PATH``: print the findings; 0 nothing blocks, 1 something would fail, 2 bad input."""
    try:
        findings, files, bad = check_path(ns.check)
    except BadInput as exc:
        print(f"accel-nb migrate: error: {exc}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding)
    for message in bad:
        print(f"accel-nb migrate: error: {message}", file=sys.stderr)
    errors = sum(f.severity == "error" for f in findings)
    notes = len(findings) - errors
    print(
        f"checked {len(files)} file(s): {errors} error(s) (would fail under accel_nb), "
        f"{notes} note(s) (run, but differ or warn)" + (f", {len(bad)} file(s) unreadable" if bad else "")
    )
    if bad:
        return 2
    if errors:
        print(
            "Fix the errors above (docs/migration.md says why each differs), then rename accelerate to accel_nb."
        )
        return 1
    print("Nothing blocks: replace `accelerate` by `accel_nb` in the import lines.")
    return 0
