"""notebooks/tpu_kaggle_colab.ipynb runs top to bottom in a real kernel of the XLA environment.

Without TPU chips the notebook asks for XLA's CPU backend with two devices itself (its second
code cell), so the kernel needs no special environment. The main suite checks the notebook's
install cell; this file runs it (``.venv-xla/bin/python -m pytest -q -p no:cacheprovider tests/xla``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed here (run in .venv-xla)", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _runner():
    spec = importlib.util.spec_from_file_location(
        "run_quickstart", os.path.join(ROOT, "examples", "run_quickstart.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.notebooks
def test_tpu_notebook_trains_on_two_xla_devices_headless(monkeypatch):
    for name in ("PJRT_DEVICE", "CPU_NUM_DEVICES"):  # the notebook sets them itself when no TPU is present
        monkeypatch.delenv(name, raising=False)
    runner = _runner()
    nb = runner.execute_notebook(os.path.join(ROOT, "notebooks", "tpu_kaggle_colab.ipynb"), timeout=600)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    results = "\n".join(runner.key_results(nb))
    assert "not on Kaggle or Colab: nothing installed" in "\n".join(
        o.get("text", "") for o in nb.cells[2].get("outputs", [])
    )
    assert "XLA runtime: XLA CPU runtime, 2 devices" in results
    assert "rank 0 of 2 on xla:0" in results and "rank 1 of 2 on xla:1" in results
    assert "loss fell: True" in results
    assert "every core ends with the same weights: True" in results
    assert "held-out mse of the trained model" in results
    assert "caught: rank 1 (first to fail) failed: ValueError: boom on core 1" in results
