"""tests/xla runs only where torch_xla imports (the .venv-xla that scripts/setup-xla-env.sh builds).

    bash scripts/setup-xla-env.sh && .venv-xla/bin/python -m pytest -q -p no:cacheprovider tests/xla

Elsewhere (the main .venv, torch 2.13) the folder is not collected at all: torch_xla 2.9.0 imports
only with exactly torch 2.9.0.
"""

import importlib.util


def _torch_xla_importable() -> bool:
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


if not _torch_xla_importable():
    collect_ignore_glob = ["test_*.py", "xla_programs.py"]
