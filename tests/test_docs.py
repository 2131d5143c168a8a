"""The documentation builds with Sphinx, warning-free, and broken references fail the build."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def sphinx_build(src: str, out: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html", src, out]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)


def test_docs_build_without_warnings(tmp_path):
    res = sphinx_build(DOCS, str(tmp_path / "html"))
    assert res.returncode == 0, res.stderr + res.stdout
    for page in ("index", "getting_started", "troubleshooting", "widgets", "api", "benchmarks"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page
    api_html = (tmp_path / "html" / "api.html").read_text()
    assert 'id="accel_nb.PartialState"' in api_html  # autodoc really rendered the API


def test_broken_reference_fails_the_build(tmp_path):
    src = tmp_path / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build"))
    (src / "broken.md").write_text(
        "# Broken\n\nSee [a page that does not exist](no_such_page.md) and {py:func}`accel_nb.no_such_function`.\n"
    )
    index = (src / "index.md").read_text().replace("getting_started\n", "getting_started\nbroken\n", 1)
    (src / "index.md").write_text(index)
    res = sphinx_build(str(src), str(tmp_path / "html"))
    assert res.returncode != 0
    assert "no_such_page.md" in res.stderr and "no_such_function" in res.stderr


def _public_names() -> list[str]:
    """Every name ``accel_nb`` exports; one that cannot be imported fails the test (never dropped)."""
    sys.path.insert(0, ROOT)
    from accel_nb import _EXPORTS

    for name, module in _EXPORTS.items():
        assert hasattr(importlib.import_module("accel_nb" + module), name), (
            f"accel_nb exports {name!r} from accel_nb{module}, which does not define it"
        )
    return list(_EXPORTS)


def test_api_reference_covers_the_public_api():
    api = open(os.path.join(DOCS, "api.md")).read()
    documented = set(re.findall(r"\.\. auto(?:class|function|data|exception):: (\w+)", api))
    missing = [n for n in _public_names() if n not in documented]
    assert not missing, f"public names missing from docs/api.md: {missing}"


def test_every_page_is_in_the_toctree():
    index = open(os.path.join(DOCS, "index.md")).read()
    pages = sorted(f[:-3] for f in os.listdir(DOCS) if f.endswith(".md") and f != "index.md")
    assert pages, "no docs pages"
    missing = [p for p in pages if not re.search(rf"^{re.escape(p)}$", index, re.M)]
    assert not missing, f"pages not in docs/index.md's toctree: {missing}"


def test_docstring_examples_become_literal_blocks():
    sys.path.insert(0, DOCS)
    try:
        import conf
        from conf import literalize_examples
    finally:
        sys.path.remove(DOCS)
    lines = ["What it is.", "", "    x = f()", "    if x:", "", "        g(x)", "", "After."]
    out = literalize_examples(lines)
    assert out[:4] == ["What it is.", "", "::", ""]
    assert out.count("::") == 1 and out[-1] == "After."
    assert literalize_examples(["Example:", "", "    f()"])[0] == "Example::"
    ended = literalize_examples(["What.", "", "    f()", "Then text."])
    assert ended == ["What.", "", "::", "", "    f()", "", "Then text."]
    raw = "Run it.\n\n        assert run() == 1\n    "
    restored = literalize_examples(conf.restore_example_indent(raw, ["Run it.", "", "assert run() == 1"]))
    assert restored == ["Run it.", "", "::", "", "    assert run() == 1"]
    flat = [
        "Handle it.",
        "",
        "except LaunchError as err:",
        "    print(err)",
        "",
        "Prose after: it stays prose.",
    ]
    assert literalize_examples(conf.indent_code_paragraphs(flat)) == [
        "Handle it.",
        "",
        "::",
        "",
        "    except LaunchError as err:",
        "        print(err)",
        "",
        "Prose after: it stays prose.",
    ]
    napoleon = ["Do it.", "", "Args:", "    x: the thing", "", "    y: other"]
    assert literalize_examples(napoleon) == napoleon


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of a docs page, in order."""
    text = open(os.path.join(DOCS, page), encoding="utf-8").read()
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


@pytest.mark.kernel
def test_getting_started_code_runs_in_a_kernel():
    """The page's code, block by block, in a real kernel: the plain loop, the change, both launches."""
    from tests.kernel_helpers import KernelSession

    blocks = [b for b in python_blocks("getting_started.md") if not re.search(r"^\s*\.\.\.\s*$", b, re.M)]
    assert len(blocks) >= 5 and any(b.startswith("%%accelerate") for b in blocks)
    with KernelSession(cwd=ROOT) as kernel:
        for block in blocks:
            out = kernel.run(block, timeout=180)
            assert out.error is None, f"{block}\n---\n{out.traceback}"
        # %%accelerate --return brought rank 0's per-step losses and the trained model back
        out = kernel.run("print(len(losses), type(trained).__name__, losses[-1] < losses[0])")
        assert out.error is None and out.stdout.split() == ["8", "Linear", "True"], out.text
