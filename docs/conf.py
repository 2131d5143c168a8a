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
html_static_path: list[str] = []  # docs/_static holds screenshots, copied where pages use them
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
        if literal_from is not None and out and out[-1].strip():
            out.append("")  # the example ended without a blank line: reST needs one
            prev_index = None
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


def restore_example_indent(raw: str | None, lines: list[str]) -> list[str]:
    """Give back the indentation that ``inspect.cleandoc`` removed from an all-example docstring body.

    When everything after the summary line is an indented example, cleandoc strips that indentation
    (it is common to every line), so the example would read as prose. The closing quotes' line tells
    the docstring's own indentation; whatever the body has beyond it is the example's.
    """
    if not isinstance(raw, str) or not lines:
        return lines
    raw_lines = raw.expandtabs().split("\n")
    if len(raw_lines) < 3 or raw_lines[-1].strip() or raw_lines[0].strip() != lines[0].strip():
        return lines
    body = [ln for ln in raw_lines[1:] if ln.strip()]
    if not body:
        return lines
    extra = min(_indent(ln) for ln in body) - len(raw_lines[-1])
    if extra <= 0:
        return lines
    return [lines[0]] + [" " * extra + ln if ln.strip() else ln for ln in lines[1:]]


def _looks_like_code(paragraph: list[str]) -> bool:
    """A paragraph that is Python, not prose (``x = f()``, ``except E as err:`` + body, ``assert ...``)."""
    import ast
    import textwrap

    text = textwrap.dedent("\n".join(paragraph))
    first = paragraph[0].strip()
    if (
        not any(c in text for c in "(=:[")
        or first[:1].isupper()
        or first.startswith(("-", "*", ":", "..", ">>>"))
    ):
        return False
    for candidate in (text, "try:\n    pass\n" + text, "if x:\n    pass\n" + text):
        try:
            ast.parse(candidate)
            return True
        except SyntaxError:
            continue
    return False


def indent_code_paragraphs(lines: list[str]) -> list[str]:
    """Indent paragraphs after the summary that are Python at the prose level, so they become examples."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i > 0 and lines[i].strip() and _indent(lines[i]) == 0 and not lines[i - 1].strip():
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            paragraph = lines[i:j]
            if _looks_like_code(paragraph):
                out += ["    " + ln for ln in paragraph]
                i = j
                continue
        out.append(lines[i])
        i += 1
    return out


def _process_docstring(app, what, name, obj, options, lines):  # noqa: ARG001 - Sphinx's signature
    lines[:] = restore_example_indent(getattr(obj, "__doc__", None), lines)
    lines[:] = literalize_examples(indent_code_paragraphs(lines))


def setup(app):
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)  # before napoleon
    return {"parallel_read_safe": True}
