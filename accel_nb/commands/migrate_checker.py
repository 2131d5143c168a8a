"""The walk over one script for ``accel-nb migrate --check``: imports, names, calls and keywords.

``check_source`` parses the code (never runs it) and walks it: each ``accelerate`` or ``accel_nb`` import
is looked up under accel_nb (``migrate_names.resolve``); calls of the imported names and of methods of an
``Accelerator`` are checked against accel_nb's signatures and ``migrate_data``'s rules. An Accelerator is
followed through every binding that can hold one: ``x = Accelerator()``, a conditional expression
(``Accelerator(...) if a else Accelerator()``), an attribute (``self.accelerator``), a function that
returns one (``acc = make()``), tuple unpacking, ``:=`` and annotations (``acc: Accelerator``). Those are
collected first (walks repeated until nothing new is found, so the order of definitions does not matter),
then a last walk reports.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from collections.abc import Callable
from typing import Any

from .migrate_data import DIFFERENCES, FORWARDS_KEYWORDS_TO, KEYWORD_RULES, LAUNCHER_REFERENCE_OPTIONS
from .migrate_names import (
    MISSING,
    ROOTS,
    UNKNOWN,
    Finding,
    attribute_position,
    catches_import_error,
    dotted,
    label,
    left_out_reason,
    literal,
    resolve,
)

__all__ = ["check_source"]

_MAIN_FLAGS = ("is_main_process", "is_local_main_process")
_RANK_INDEXES = ("process_index", "local_process_index")
_COLLECTIVE = ("Accelerator.save_state", "Accelerator.load_state")
_FOLDER_TRACKERS = {"all", "wandb", "comet_ml", "tensorboard"}


def _main_only(test: ast.AST) -> bool | None:
    """True when the body of ``if test:`` runs on the main process only, False when its ``else`` does,
    None when neither (``accelerator.is_main_process``, ``process_index == 0``, ``not ...``, ``a and ...``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _main_only(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return True if any(_main_only(v) is True for v in test.values) else None
    if isinstance(test, ast.Attribute) and test.attr in _MAIN_FLAGS:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        sides = (test.left, test.comparators[0])
        index = any(isinstance(s, ast.Attribute) and s.attr in _RANK_INDEXES for s in sides)
        zero = any(isinstance(s, ast.Constant) and s.value == 0 for s in sides)
        if index and zero:
            if isinstance(test.ops[0], ast.Eq | ast.LtE):
                return True
            if isinstance(test.ops[0], ast.NotEq | ast.Gt):
                return False
    return None


class _Checker(ast.NodeVisitor):
    def __init__(
        self, where: Callable[[int, int], str], accelerators: set[str], factories: set[str], record: bool
    ) -> None:
        self.where = where  # (line, 1-based column) -> "file:line:column"
        self.findings: list[Finding] = []
        self.record = record  # False while the walks only collect the accelerators and factories
        self.bound: dict[
            str, list[str]
        ] = {}  # local name -> its dotted path, root first (accelerate/accel_nb)
        self.roots: set[str] = set()  # which of accelerate / accel_nb the code imports
        self.accelerators = accelerators  # dotted names bound to an Accelerator (x, self.accelerator)
        self.factories = factories  # functions (and methods) that return an Accelerator
        self.functions: list[str] = []  # the functions the walk is inside
        self.noted: set[tuple[str, int, int]] = set()
        self.pending: list[tuple[ast.AST, str]] = []  # differences of imported names, noted if never used
        self.used: set[str] = set()
        self.guard: str | None = (
            None  # why an import here may never run (an `if`, a `try` catching ImportError)
        )
        self.main_only: str | None = None  # where the code runs on the main process only
        self.importing = False
        import accel_nb  # deferred: the checker needs accel_nb only when it runs

        self.accelerator_class = accel_nb.Accelerator

    def add(self, node: ast.AST, severity: str, message: str, at: tuple[int, int] | None = None) -> None:
        if not self.record:
            return
        if severity == "error" and self.importing and self.guard:
            severity, message = "note", f"{message}; {self.guard}"
        line, column = at or (getattr(node, "lineno", 1), getattr(node, "col_offset", 0))
        finding = Finding(self.where(line, column + 1), severity, message, line, column + 1)
        if finding not in self.findings:
            self.findings.append(finding)

    # -- names ------------------------------------------------------------------------------------------
    def missing(self, node: ast.AST, parts: list[str], upto: int, at: tuple[int, int] | None) -> None:
        inner = parts[1:]
        parent = ".".join(["accel_nb", *inner[:upto]])
        reason = left_out_reason(inner[: upto + 1] + inner[upto + 1 : upto + 2])
        if reason is None and upto + 1 < len(inner):
            reason = left_out_reason(inner)
        ref = ".".join(parts)
        if reason:
            self.add(node, "error", f"`{ref}` is left out of accel_nb on purpose: {reason}", at)
        else:
            message = f"`{ref}`: accel_nb has no `{inner[upto]}` in `{parent}` (not provided yet; see docs/migration.md)"
            self.add(node, "error", message, at)

    def touch(self, node: ast.AST, name: str, at: tuple[int, int] | None = None) -> None:
        """Note each deliberate difference (migrate_data.DIFFERENCES) of ``name``, at the place it is used."""
        line, column = at or (getattr(node, "lineno", 1), getattr(node, "col_offset", 0))
        for diff in DIFFERENCES:
            if diff.name == name and (name, line, column) not in self.noted:
                self.used.add(name)
                self.noted.add((name, line, column))
                message = f"`{name}` differs on purpose: {diff.message} (docs/migration.md: {diff.anchor})"
                self.add(node, "note", message, (line, column))

    def check_parts(self, node: ast.AST, parts: list[str], at: tuple[int, int] | None = None) -> Any:
        obj, upto = resolve(parts[1:])
        if obj is MISSING:
            self.missing(node, parts, upto, at)
            return MISSING
        if not isinstance(obj, types.ModuleType):
            if self.importing:  # noted where it is used; at the import only when it is never used
                self.pending.append((node, label(obj)))
            else:
                self.touch(node, label(obj), at)
        return obj

    def finish(self) -> None:
        for node, name in self.pending:
            if name not in self.used:
                self.touch(node, name)

    # -- imports that may never run: reported as notes, they fail only when they run ---------------------
    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        outer, outer_main = self.guard, self.main_only
        self.guard = f"it is inside the `if` of line {node.lineno}, so it fails only when that branch runs"
        side, test = _main_only(node.test), ast.unparse(node.test)
        if side is True:
            self.main_only = f"under the `if {test}:` of line {node.lineno}"
        for child in node.body:
            self.visit(child)
        self.main_only = (
            f"in the `else` of the `if {test}:` of line {node.lineno}" if side is False else outer_main
        )
        for child in node.orelse:
            self.visit(child)
        self.guard, self.main_only = outer, outer_main

    def visit_Try(self, node: ast.Try) -> None:
        outer = self.guard
        if any(catches_import_error(handler.type) for handler in node.handlers):
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
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] not in ROOTS:
                    continue
                self.roots.add(parts[0])
                self.check_parts(node, parts)
                self.bound[alias.asname or parts[0]] = parts if alias.asname else parts[:1]
        finally:
            self.importing = False

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] not in ROOTS:
            return
        parts = node.module.split(".")
        self.roots.add(parts[0])
        self.importing = True
        try:
            if self.check_parts(node, parts) is MISSING:
                return
            for alias in node.names:
                if alias.name == "*":
                    self.add(
                        node, "note", f"`from {node.module} import *`: names used from it are not checked"
                    )
                    continue
                self.bound[alias.asname or alias.name] = [*parts, alias.name]
                self.check_parts(node, [*parts, alias.name])
        finally:
            self.importing = False

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.bound:
            obj, _ = resolve(self.bound[node.id][1:])
            if obj is not MISSING and not isinstance(obj, types.ModuleType):
                self.touch(node, label(obj))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        names = dotted(node)
        if names and names[0] in self.bound:
            self.check_parts(node, self.bound[names[0]] + names[1:], attribute_position(node))
            return  # the inner attributes are part of this chain
        if names and names[-2:] == ["device", "index"] and ".".join(names[:-2]) in self.accelerators:
            self.touch(node, "Accelerator.device", attribute_position(node))  # None here on a CPU process
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        if any(isinstance(s, ast.Constant) and str(s.value).startswith("cpu:") for s in sides):
            for side in sides:
                if isinstance(side, ast.Call) and getattr(side.func, "id", None) == "str" and side.args:
                    side = side.args[0]
                names = dotted(side)
                if names and names[-1] == "device" and ".".join(names[:-1]) in self.accelerators:
                    self.touch(side, "Accelerator.device")
        self.generic_visit(node)

    # -- what can hold an Accelerator -----------------------------------------------------------------
    def is_class(self, node: ast.AST | None) -> bool:
        """``Accelerator`` imported from accelerate (or accel_nb), as it is spelt here."""
        names = dotted(node)
        if not names or names[0] not in self.bound:
            return False
        return resolve(self.bound[names[0]][1:] + names[1:])[0] is self.accelerator_class

    def is_annotation(self, node: ast.AST | None) -> bool:
        """``Accelerator``, ``"Accelerator"``, ``Accelerator | None``, ``Optional[Accelerator]``."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                return self.is_annotation(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.is_annotation(node.left) or self.is_annotation(node.right)
        if isinstance(node, ast.Subscript) and (dotted(node.value) or [""])[-1] in ("Optional", "Union"):
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return any(self.is_annotation(item) for item in items)
        return self.is_class(node)

    def holds_accelerator(self, node: ast.AST | None) -> bool:
        """Whether the value of this expression can be an Accelerator."""
        if isinstance(node, ast.Call):
            names = dotted(node.func) or []
            made = len(names) == 1 or (len(names) == 2 and names[0] in ("self", "cls"))
            return self.is_class(node.func) or (made and names[-1] in self.factories)
        if isinstance(node, ast.IfExp):
            return self.holds_accelerator(node.body) or self.holds_accelerator(node.orelse)
        if isinstance(node, ast.BoolOp):
            return any(self.holds_accelerator(value) for value in node.values)
        if isinstance(node, ast.NamedExpr | ast.Await):
            return self.holds_accelerator(node.value)
        names = dotted(node)
        return bool(names) and ".".join(names) in self.accelerators

    def bind(self, target: ast.AST, value: ast.AST | None) -> None:
        pair = isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List)
        if pair and len(target.elts) == len(value.elts):  # type: ignore[union-attr]
            if not any(isinstance(e, ast.Starred) for e in [*target.elts, *value.elts]):  # type: ignore[union-attr]
                for item, part in zip(target.elts, value.elts):  # type: ignore[union-attr]
                    self.bind(item, part)
                return
        names = dotted(target)
        if names and self.holds_accelerator(value):
            self.accelerators.add(".".join(names))

    def rebind(self, name: str) -> None:
        """A later def/class/assignment of an imported name: it no longer means accelerate's object."""
        self.bound.pop(name, None)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        outer_main = self.main_only
        if not isinstance(node, ast.ClassDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if self.is_annotation(arg.annotation):
                    self.accelerators.add(arg.arg)
            if self.is_annotation(node.returns):
                self.factories.add(node.name)
            self.main_only = None  # a function body runs when it is called, not where it is defined
            for decorator in node.decorator_list:
                names = dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) or [""]
                if names[-1] in ("on_main_process", "on_local_main_process"):
                    self.main_only = f"in `{node.name}`, decorated with `@{'.'.join(names)}`"
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()
        self.main_only = outer_main
        self.rebind(node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Return(self, node: ast.Return) -> None:
        if self.functions and self.holds_accelerator(node.value):
            self.factories.add(self.functions[-1])
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id in self.bound:
                self.generic_visit(node)
                self.rebind(target.id)
                return
        for target in node.targets:
            self.bind(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        names = dotted(node.target)
        if names and (self.is_annotation(node.annotation) or self.holds_accelerator(node.value)):
            self.accelerators.add(".".join(names))
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.bind(node.target, node.value)
        self.generic_visit(node)

    # -- calls ------------------------------------------------------------------------------------------
    def callee(self, func: ast.AST) -> tuple[Any, str | None]:
        names = dotted(func)
        if not names:
            return None, None
        if names[0] in self.bound:
            obj, _ = resolve(self.bound[names[0]][1:] + names[1:])
            return (None, None) if obj is MISSING or isinstance(obj, types.ModuleType) else (obj, label(obj))
        owner = ".".join(names[:-1])
        if len(names) > 1 and owner in self.accelerators:
            method, at = names[-1], attribute_position(func)
            found = getattr(self.accelerator_class, method, MISSING)
            if found is MISSING:
                self.add(
                    func, "error", f"accel_nb's Accelerator has no `{method}` (`{owner}.{method}(...)`)", at
                )
                return None, None
            self.touch(func, f"Accelerator.{method}", at)
            return found, f"Accelerator.{method}"
        return None, None

    def visit_Call(self, node: ast.Call) -> None:
        obj, name = self.callee(node.func)
        if obj is not None and name is not None and callable(obj):
            self.check_keywords(node, obj, name)
            self.check_call(node, name)
        self.generic_visit(node)

    def check_call(self, node: ast.Call, name: str) -> None:
        """The differences a call shows by its place and arguments (docs/migration.md, Deliberate differences)."""
        keywords = {kw.arg: kw for kw in node.keywords if kw.arg is not None}
        if name in _COLLECTIVE:
            method = name.split(".")[1]
            if self.main_only and method == "save_state":
                self.add(
                    node,
                    "note",
                    f"`save_state(...)` {self.main_only} runs on the main process only: accel_nb sees that from "
                    "the code and the main process writes the checkpoint alone, as the reference does (on "
                    "load_state the other ranks keep their random state); with FSDP, DeepSpeed, tensor "
                    "parallelism or XLA each process holds a part, so it is refused at once there: call it on "
                    "every process (docs/checkpointing.md)",
                    attribute_position(node.func),
                )
            elif self.main_only:
                self.add(
                    node,
                    "error",
                    f"`{method}(...)` {self.main_only} runs on the main process only: every process restores "
                    f"its own state, so accel_nb refuses it at once; call {method} on every process "
                    "(docs/checkpointing.md)",
                    attribute_position(node.func),
                )
            folder = node.args[0] if node.args else None
            folder = folder or next((kw.value for k, kw in keywords.items() if k.endswith("_dir")), None)
            if folder is not None and any(
                isinstance(n, ast.Attribute) and n.attr in _RANK_INDEXES for n in ast.walk(folder)
            ):
                if method == "save_state":
                    self.touch(folder, "Accelerator.save_state(a folder per rank)")
                else:
                    message = (
                        "`load_state(...)` of a folder that differs per rank raises CheckpointError on every "
                        "rank: a checkpoint is one folder, the main process's; pass the same folder on every "
                        "rank (docs/migration.md: A checkpoint is one folder, the main process's)"
                    )
                    self.add(folder, "error", message)
        if (
            name == "Accelerator"
            and "log_with" in keywords
            and keywords.keys() & {"project_dir", "project_config"}
        ):
            value = literal(keywords["log_with"].value)
            values = value if isinstance(value, list | tuple) else [value]
            if value is UNKNOWN or any(isinstance(v, str) and v.lower() in _FOLDER_TRACKERS for v in values):
                self.touch(keywords["log_with"], "Accelerator(log_with=..., project_dir=...)")

    def check_keywords(self, node: ast.Call, obj: Any, name: str) -> None:
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            signature = None
        keywords = {kw.arg: kw for kw in node.keywords if kw.arg is not None}
        if signature is not None:
            params = signature.parameters
            kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            accepted = {n for n, p in params.items() if p.kind in kinds and n != "self"}
            open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
            if name == "notebook_launcher":
                from ..launch.options import LaunchOptions  # deferred: only a launcher call needs its options

                accepted |= set(LaunchOptions.names()) | LAUNCHER_REFERENCE_OPTIONS
                open_ended = False
            elif name == "Accelerator":
                open_ended = False  # its **kwargs only catch the reference's other arguments to refuse them
            elif open_ended and name in FORWARDS_KEYWORDS_TO:
                module, _, function = FORWARDS_KEYWORDS_TO[name].partition(":")
                target = inspect.signature(getattr(importlib.import_module(module), function)).parameters
                accepted |= {n for n, p in list(target.items())[1:] if p.kind in kinds}
                open_ended = any(p.kind is p.VAR_KEYWORD for p in target.values())
            if not open_ended:
                for given, keyword in keywords.items():
                    if given not in accepted:
                        message = (
                            f"`{name}(...)` is given `{given}=`, which accel_nb's {name} does not take "
                            f"(it takes: {', '.join(sorted(accepted)) or 'no keywords'})"
                        )
                        self.add(keyword, "error", message)
        for rule in KEYWORD_RULES:
            if rule.callee != name:
                continue
            value_node: ast.AST | None = keywords[rule.keyword] if rule.keyword in keywords else None
            if value_node is None and rule.position is not None:
                args = [a for a in node.args if not isinstance(a, ast.Starred)]
                if len(args) > rule.position:
                    value_node = args[rule.position]
            if value_node is None:
                continue
            value = literal(value_node.value if isinstance(value_node, ast.keyword) else value_node)
            if value is UNKNOWN:
                if rule.severity == "error":
                    message = f"`{name}({rule.keyword}=...)`: if not the default, {rule.message}"
                    self.add(value_node, "note", message)
                continue
            if rule.matches(value):
                self.add(value_node, rule.severity, f"`{name}({rule.keyword}={value!r})`: {rule.message}")


def check_source(source: str, where: Callable[[int, int], str]) -> tuple[list[Finding], set[str]]:
    """(findings, which of "accelerate" / "accel_nb" the code imports) for one piece of Python source;
    ``where(line, column)`` names a place (column 1-based). SyntaxError propagates."""
    tree = ast.parse(source)
    accelerators: set[str] = set()
    factories: set[str] = set()
    for _ in range(8):  # collect what holds an Accelerator until a walk finds nothing new
        size = (len(accelerators), len(factories))
        _Checker(where, accelerators, factories, record=False).visit(tree)
        if (len(accelerators), len(factories)) == size:
            break
    checker = _Checker(where, accelerators, factories, record=True)
    checker.visit(tree)
    checker.finish()
    return sorted(checker.findings, key=lambda f: (f.line, f.column)), checker.roots
