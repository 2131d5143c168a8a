"""The notebooks in notebooks/ run top to bottom in a real kernel of the stack (nbclient), with the
same key results as on the newest Jupyter (tests/test_notebooks.py) and no display trouble."""

from __future__ import annotations

import os

import pytest

from tests.test_notebooks import NOTEBOOKS, all_text, error_outputs, runner

pytestmark = [pytest.mark.notebooks, pytest.mark.timeout(600)]

PROBLEMS = ("reporter failed", "the progress widget could not", "display failed to start")


def _widget_states(nb, model_name):
    state = (
        nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    )
    return [m["state"] for m in state.values() if m.get("model_name") == model_name]


def test_quickstart(tmp_path):
    summary = runner.run(os.path.join(NOTEBOOKS, "quickstart.ipynb"), str(tmp_path / "out"))
    import nbformat

    nb = nbformat.read(summary["notebook"], as_version=4)
    assert error_outputs(nb) == []
    results = "\n".join(summary["results"])
    assert "ranks: [0, 1]" in results and "caught: rank 1 failed with ValueError: boom on rank 1" in results
    assert "trained model (back in this notebook): Sequential" in results
    bars = _widget_states(nb, "IntProgressModel")
    full = [b for b in bars if (b.get("max"), b.get("value"), b.get("bar_style")) == (48, 48, "success")]
    assert len(full) == 4 and sum(b.get("bar_style") == "danger" for b in bars) == 1, bars
    text = all_text(nb)
    assert not any(p in text for p in PROBLEMS), text
    assert "48/48" in open(summary["html"], encoding="utf-8").read()  # the final summary, in the export


def test_interactive_session():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "interactive_session.ipynb"), timeout=600)
    errors = error_outputs(nb)
    # the tagged cell
    assert len(errors) == 1 and "rank 1 (first to fail) failed: ValueError" in errors[0], errors
    results = "\n".join(runner.key_results(nb))
    assert "rank 1 computed scaled = 10.0" in results and "worker processes left: 0" in results
    text = all_text(nb)
    assert not any(p in text for p in PROBLEMS), text
    tracebacks = "\n".join("\n".join(o.get("traceback", [])) for c in nb.cells for o in c.get("outputs", []))
    for internal in ("interactiveshell", "decorator", "magic.py", "IPython/core"):
        assert internal not in tracebacks, (internal, tracebacks)


def test_config_wizard():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "config_wizard.ipynb"), timeout=300)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "num_processes=2, mixed_precision=no" in results and "num_processes: 2" in results
    assert _widget_states(nb, "ButtonModel"), "the wizard's widgets were not kept in the notebook"


def test_big_model_inference():
    nb = runner.execute_notebook(os.path.join(NOTEBOOKS, "big_model_inference.ipynb"), timeout=600)
    assert error_outputs(nb) == []
    results = "\n".join(runner.key_results(nb))
    assert "offloaded forward matches the in-memory model: True" in results
    assert _widget_states(nb, "FloatSliderModel"), "the device map's sliders were not kept in the notebook"
    text = all_text(nb)
    assert not any(p in text for p in PROBLEMS), text
