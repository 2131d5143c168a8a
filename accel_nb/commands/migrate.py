"""``accel-nb migrate --check PATH``: what a script written for accelerate would hit under accel_nb.

    accel-nb migrate --check train.py          # one script
    accel-nb migrate --check src/              # every .py and .ipynb under a folder
    accel-nb migrate --check notebook.ipynb    # the code cells of a notebook

The user's files are read, never imported, run or written: each is parsed (``ast``), its ``accelerate``
imports are renamed to ``accel_nb`` in memory (``accel_nb`` imports, of a file already renamed, are
checked the same way), and each imported name is looked up under the same dotted path of accel_nb.
Reported, per ``file:line:column`` of the import, call, attribute or keyword: names accel_nb lacks (with
the reason when they are left out on purpose), keywords that the accel_nb object refuses (read from its
signature) or warns about, calls on an ``Accelerator`` that accel_nb's lacks, a ``save_state`` that only
the main process runs, and every deliberate difference the code touches (``migrate_data``). The walk
itself is ``migrate_checker``. Exit status: 0 nothing blocks, 1 something would fail, 2 bad input or
nothing to check (no file imports accelerate or accel_nb).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NamedTuple

from .migrate_checker import check_source
from .migrate_names import Finding

__all__ = ["BadInput", "Finding", "Report", "add_parser", "check_file", "check_path", "check_source", "run"]

_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".ipynb_checkpoints", ".tox"}


class BadInput(Exception):
    """The path is missing, unreadable, or not Python (exit status 2)."""


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


def check_file(path: str) -> tuple[list[Finding], set[str]]:
    """(findings, which of "accelerate" / "accel_nb" it imports) for one .py or .ipynb file; BadInput when
    it cannot be read or parsed."""
    if path.endswith(".ipynb"):
        source, places = _notebook_source(path)

        def where(lineno: int, column: int = 1) -> str:
            cell, line = places[min(lineno, len(places)) - 1] if places else (0, lineno)
            return f"{path}:cell {cell}:line {line}:col {column}"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path}: cannot be read ({exc})") from exc

        def where(lineno: int, column: int = 1) -> str:
            return f"{path}:{lineno}:{column}"

    try:
        return check_source(source, where)
    except SyntaxError as exc:
        place = where(exc.lineno or 1, exc.offset or 1)
        raise BadInput(f"{place}: not valid Python ({exc.msg}); fix it and check again") from exc


class Report(NamedTuple):
    """What ``check_path`` found: ``files`` every file read, ``unchecked`` those importing neither
    accelerate nor accel_nb (nothing in them was checked), ``bad`` one message per unreadable file,
    ``renamed`` whether some file imports accel_nb and none accelerate."""

    findings: list[Finding]
    files: list[str]
    bad: list[str]
    unchecked: list[str]
    renamed: bool


def check_path(path: str) -> Report:
    """The findings for a file or a folder (BadInput when the path is missing or holds no .py/.ipynb)."""
    files = _files(path)
    findings: list[Finding] = []
    bad: list[str] = []
    unchecked: list[str] = []
    roots: set[str] = set()
    for file in files:
        try:
            found, imported = check_file(file)
        except BadInput as exc:
            bad.append(str(exc))
            continue
        findings += found
        roots |= imported
        if not imported:
            unchecked.append(file)
    return Report(findings, files, bad, unchecked, roots == {"accel_nb"})


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
    """``accel-nb migrate --check PATH``: print the findings; 0 nothing blocks, 1 something would fail, 2 bad
    input or nothing checked."""
    try:
        report = check_path(ns.check)
    except BadInput as exc:
        print(f"accel-nb migrate: error: {exc}", file=sys.stderr)
        return 2
    for finding in report.findings:
        print(finding)
    for message in report.bad:
        print(f"accel-nb migrate: error: {message}", file=sys.stderr)
    errors = sum(f.severity == "error" for f in report.findings)
    notes = len(report.findings) - errors
    read = len(report.files) - len(report.bad)
    checked = read - len(report.unchecked)
    print(
        f"checked {checked} file(s): {errors} error(s) (would fail under accel_nb), "
        f"{notes} note(s) (run, but differ or warn)"
        + (
            f"; {len(report.unchecked)} file(s) import neither accelerate nor accel_nb, not checked"
            if report.unchecked
            else ""
        )
        + (f", {len(report.bad)} file(s) unreadable" if report.bad else "")
    )
    if report.bad:
        return 2
    if not checked:
        print(
            f"accel-nb migrate: error: nothing was checked: {ns.check} imports neither accelerate nor accel_nb "
            "(the check follows the names imported from them)",
            file=sys.stderr,
        )
        return 2
    if errors:
        print(
            "Fix the errors above (docs/migration.md says why each differs), then rename accelerate to accel_nb."
            if not report.renamed
            else "Fix the errors above (docs/migration.md says why each differs)."
        )
        return 1
    if report.renamed:
        print("Nothing blocks: the accel_nb names, keywords and methods used all exist in accel_nb.")
    else:
        print("Nothing blocks: replace `accelerate` by `accel_nb` in the import lines.")
    return 0
