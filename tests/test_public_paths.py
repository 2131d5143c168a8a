"""Every ``from accel_nb... import name`` and ``import accel_nb...`` written in the docs, the README,
the notebooks and the examples works: the layout may move code, never a documented path."""

from __future__ import annotations

import glob
import importlib
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FROM_IMPORT = re.compile(r"^[ \t>]*from\s+(accel_nb(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.M)
PLAIN_IMPORT = re.compile(r"^[ \t>]*import\s+(accel_nb(?:\.\w+)*)", re.M)
DOTTED = re.compile(r"`(accel_nb(?:\.\w+)+)(?:\(|`)")  # `accel_nb.x.y` or `accel_nb.x.f(...)` in a doc


def _texts() -> dict[str, str]:
    out: dict[str, str] = {}
    paths = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    paths += [os.path.join(ROOT, "README.md")]
    paths += glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True)
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out[os.path.relpath(path, ROOT)] = f.read()
    for path in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")):
        with open(path, encoding="utf-8") as f:
            cells = json.load(f)["cells"]
        out[os.path.relpath(path, ROOT)] = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "code"
        )
    return out


def documented_imports() -> list[tuple[str, str, str | None]]:
    """(where, module, name or None) for every import of accel_nb written in the documentation."""
    found: set[tuple[str, str, str | None]] = set()
    for where, text in _texts().items():
        for module, names in FROM_IMPORT.findall(text):
            for part in names.strip("()").replace("\n", ",").split(","):
                name = part.split("#")[0].strip().split(" as ")[0].strip()
                if re.fullmatch(r"\w+", name) and name != "*":
                    found.add((where, module, name))
        for module in PLAIN_IMPORT.findall(text):
            found.add((where, module, None))
        for dotted in DOTTED.findall(text):
            found.add((where, dotted, ""))
    return sorted(found, key=lambda t: (t[1], t[2] or "", t[0]))


IMPORTS = documented_imports()


def test_the_docs_name_many_paths():
    assert len({(m, n) for _, m, n in IMPORTS}) > 60  # the scan itself works


@pytest.mark.parametrize("where, module, name", IMPORTS, ids=[f"{m}:{n}" for _, m, n in IMPORTS])
def test_a_documented_import_works(where, module, name):
    if name == "":  # a dotted reference: the longest importable module, then attributes
        _resolve(where, module)
        return
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if exc.name and not exc.name.startswith("accel_nb"):
            pytest.skip(f"optional dependency {exc.name} not installed")
        raise AssertionError(
            f"{where} imports {module}, which is gone ({exc}); fix the doc or keep the path"
        ) from exc
    if name is None:
        return
    try:
        getattr(mod, name)
    except AttributeError:
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError as exc:
            raise AssertionError(
                f"{where}: `from {module} import {name}` fails; fix the doc or keep the name"
            ) from exc
    except ImportError as exc:  # a lazy name whose optional dependency is missing
        if exc.name and not exc.name.startswith("accel_nb"):
            pytest.skip(f"optional dependency {exc.name} not installed")
        raise


def _resolve(where: str, dotted: str) -> None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("accel_nb"):
                pytest.skip(f"optional dependency {exc.name} not installed")
            continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), (
                f"{where} names `{dotted}`, which is gone; fix the doc or keep the name"
            )
            obj = getattr(obj, attr)
        return
