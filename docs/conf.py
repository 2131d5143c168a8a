"""Sphinx configuration: MyST Markdown pages plus autodoc of accel_nb's public API.

Build (CI runs exactly this, through tests/test_docs.py):

    sphinx-build -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")

project = "accel_nb"
author = "accel_nb contributors"
copyright = "2026, accel_nb contributors"  # noqa: A001 - Sphinx's name for it
try:
    from accel_nb import __version__ as release
except Exception:  # pragma: no cover - the docs still build without the package importable
    release = "0.1.0"
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "README.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve; broken ones are warnings

# Broken references fail the build (-n -W). Only types from outside accel_nb are excused:
# torch, numpy, the standard library and the Jupyter stack have no inventory here (no network).
nitpicky = True
_EXTERNAL = (
    r"(torch|numpy|np|nn|safetensors|transformers|ipywidgets|IPython|psutil|yaml|cloudpickle"
    r"|typing|collections|contextlib|concurrent|os|pathlib|io|enum|dataclasses|types|abc"
    r"|threading|multiprocessing|subprocess|datetime|logging)(\..*)?"
)
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL),
    # builtins and typing names as they appear in docstrings
    (
        r"py:.*",
        r"(Any|Callable|Iterable|Iterator|Mapping|Sequence|Optional|Union|Literal|Self"
        r"|int|float|str|bool|bytes|dict|list|tuple|set|None|object|type|callable"
        r"|optional|Path|PathLike|Tensor|Module|Optimizer|DataLoader|Dataset)",
    ),
]

autodoc_typehints = "none"  # signatures show names and defaults; docstrings explain the types
autodoc_member_order = "bysource"
autodoc_default_options = {"undoc-members": False}
add_module_names = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"accel_nb {release}"
html_static_path: list[str] = []
html_theme_options = {"description": "Device-agnostic PyTorch, launched from a notebook"}

# -- docstrings -----------------------------------------------------------------------------------
# accel_nb docstrings follow the project style: one line of what, then a short example as a plain
# indented block. reStructuredText wants "::" before such a block; add it here so the sources stay
# plain and autodoc renders the examples as code instead of failing on "Unexpected indentation".
_NAPOLEON_SECTIONS = {
    "args",
    "arguments",
    "parameters",
    "params",
    "returns",
    "return",
    "raises",
    "raise",
    "yields",
    "yield",
    "attributes",
    "note",
    "notes",
    "warning",
    "warnings",
    "see also",
    "keyword args",
    "keyword arguments",
    "other parameters",
    "methods",
    "todo",
    "references",
}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_structural(line: str) -> bool:
    """A line after which indentation already means something in reST (directive, list, field)."""
    s = line.strip()
    return (
        s.startswith((".. ", "- ", "* ", "+ ", ":", ">>>"))
        or s[:-1].strip().lower() in _NAPOLEON_SECTIONS
        and s.endswith(":")
        or (s[:1].isdigit() and s.split(" ", 1)[0].rstrip(".)").isdigit())
    )


def literalize_examples(lines: list[str]) -> list[str]:
    """Turn indented example blocks that follow a plain paragraph into literal blocks."""
    out: list[str] = []
    literal_from: int | None = None  # indentation of the paragraph that opened a literal block
    prev_index: int | None = None  # index in `out` of the previous non-blank line
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        indent = _indent(line)
        if literal_from is not None and indent > literal_from:
            out.append(line)
            continue
        literal_from = None
        if prev_index is not None and out[-1].strip() == "":
            prev = out[prev_index]
            if indent > _indent(prev):
                if prev.rstrip().endswith("::"):
                    literal_from = _indent(prev)
                elif not _is_structural(prev):
                    if prev.rstrip().endswith(":"):
                        out[prev_index] = prev.rstrip() + ":"
                    else:
                        out[-1:] = ["", "::", ""]
                    literal_from = _indent(prev)
        elif line.rstrip().endswith("::"):
            pass
        out.append(line)
        prev_index = len(out) - 1
    return out


def _process_docstring(app, what, name, obj, options, lines):  # noqa: ARG001 - Sphinx's signature
    lines[:] = literalize_examples(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)  # before napoleon
    return {"parallel_read_safe": True}
