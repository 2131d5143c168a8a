"""The background import of torch after a first fork launch never shows a half-imported torch."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CODE = """
from accel_nb.launch import preimport
preimport.start()                 # a background import under way (a kernel starts one between cells)
from accel_nb import Session         # the user's next cell, while torch is still importing
from accel_nb.launch import cuda_guard
print("ok", Session.__name__, cuda_guard.cuda_initialized())
"""


def test_a_public_import_during_the_background_warm_up_waits_for_torch():
    """`from accel_nb import Session` right after warming starts (it raised ImportError: torch half-imported)."""
    for _ in range(2):
        res = subprocess.run(
            [sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=240
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "ok Session False", res.stdout


def test_imported_module_never_starts_an_import():
    code = "import sys; from accel_nb.utils import imported_module; print(imported_module('torch'), 'torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "None False"
