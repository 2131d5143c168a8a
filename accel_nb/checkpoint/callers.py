"""Is this ``save_state`` running on the main process only? Read from the caller's code, without waiting.

Code written for the reference often saves like this::

    if accelerator.is_main_process:
        accelerator.save_state(folder)
    accelerator.wait_for_everyone()

A save that agrees with the other ranks would wait for ranks that never come (they are in
``wait_for_everyone``). One process cannot learn whether the others will call ``save_state`` too
without waiting for them, so the question is answered from the code that is running: each of the
user's frames on the stack (accel_nb's and libraries' frames aside) is looked up in its source
(files, notebook cells and ``%%accelerate`` cells alike, through ``linecache``), and the call is
main-process-only when one of them runs inside

- an ``if`` whose test reads ``is_main_process`` / ``is_local_main_process``, or compares
  ``process_index`` / ``local_process_index`` with 0 (the ``else`` of ``if not ...``), or
- a function decorated with ``@accelerator.on_main_process`` / ``on_local_main_process``.

    main_process_guard()     # "if accelerator.is_main_process:" (line 12 of train.py), or None
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
from types import FrameType

__all__ = ["main_process_guard"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MAIN_FLAGS = ("is_main_process", "is_local_main_process")
_MAIN_INDEX = ("process_index", "local_process_index")
_MAIN_DECORATORS = ("on_main_process", "on_local_main_process")
_MAX_FRAMES = 40  # user frames looked at, innermost first


def _library(filename: str) -> bool:
    if filename.startswith("<frozen ") or os.path.abspath(filename).startswith(_PACKAGE_DIR):
        return True
    return any(part in filename for part in ("site-packages", "dist-packages", f"lib{os.sep}python3."))


def _attr_names(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name)
    }


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def _main_test(test: ast.AST) -> tuple[bool, bool] | None:
    """(is a main-process test, negated) for an ``if`` test, or None when it is not one."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _main_test(test.operand)
        return None if inner is None else (True, not inner[1])
    if isinstance(test, ast.Attribute) and test.attr in _MAIN_FLAGS:
        return True, False
    if isinstance(test, ast.Name) and test.id in _MAIN_FLAGS:
        return True, False
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1:
        left, right, op = test.left, test.comparators[0], test.ops[0]
        names = _attr_names(left) | _attr_names(right)
        if names & set(_MAIN_INDEX) and (_is_zero(left) or _is_zero(right)):
            if isinstance(op, ast.Eq):
                return True, False
            if isinstance(op, ast.NotEq):
                return True, True
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):  # `if x and acc.is_main_process:`
        for value in test.values:
            found = _main_test(value)
            if found is not None and not found[1]:
                return True, False
    return None


@functools.lru_cache(maxsize=64)
def _guards(source: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, the guard's text) of every main-process-only block in ``source``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    lines = source.splitlines()
    out: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            found = _main_test(node.test)
            if found is None:
                continue
            body = node.orelse if found[1] else node.body
            if body:
                text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else "if ..."
                out.append((body[0].lineno, body[-1].end_lineno or body[-1].lineno, text))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name in _MAIN_DECORATORS and node.body:
                    out.append((node.body[0].lineno, node.end_lineno or node.lineno, f"@...{name}"))
    return tuple(out)


def _guard_at(frame: FrameType) -> str | None:
    filename = frame.f_code.co_filename
    source = "".join(linecache.getlines(filename, frame.f_globals))
    if not source:
        return None
    lineno = frame.f_lineno
    for first, last, text in _guards(source):
        if first <= lineno <= last:
            return f"{text} (line {lineno} of {filename})"
    return None


def main_process_guard(frame: FrameType | None = None) -> str | None:
    """The main-process-only block the current call runs in (its text and place), or None."""
    frame = sys._getframe(1) if frame is None else frame
    seen = 0
    while frame is not None and seen < _MAX_FRAMES:
        if not _library(frame.f_code.co_filename):
            seen += 1
            found = _guard_at(frame)
            if found is not None:
                return found
        frame = frame.f_back
    return None
