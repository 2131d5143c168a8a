"""tests/stacks runs only in a notebook-stack venv that scripts/setup-stack-env.sh built:

    bash scripts/setup-stack-env.sh colab && .venv-colab/bin/python -m pytest -q -p no:cacheprovider tests/stacks
    bash scripts/setup-stack-env.sh kaggle && .venv-kaggle/bin/python -m pytest -q -p no:cacheprovider tests/stacks

The venv names its stack in ``<venv>/.accel_nb-stack``. Elsewhere (the main .venv) the folder is not
collected at all: the main suite tests the newest Jupyter; these test the runtimes people use.
"""

from __future__ import annotations

import os
import sys

import pytest

_MARKER = os.path.join(sys.prefix, ".accel_nb-stack")
STACK = open(_MARKER).read().strip() if os.path.exists(_MARKER) else None

if STACK is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def stack() -> str:
    """``"colab"`` or ``"kaggle"``: the stack of the running venv."""
    return STACK
