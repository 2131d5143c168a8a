"""Environment-variable helpers: set some for a block, or run a block with none.

    with patch_environment(master_port=29501, omp_num_threads=1):
        ...        # MASTER_PORT="29501", OMP_NUM_THREADS="1"; previous values back afterwards
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["clear_environment", "patch_environment"]


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set ``KEY=str(value)`` (keys upper-cased) for the block; restore or remove them after, even on error.

    with patch_environment(foo="bar"):
        assert os.environ["FOO"] == "bar"
    """
    previous: dict[str, str | None] = {}
    for key, value in kwargs.items():
        name = key.upper()
        previous.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the whole previous environment comes back after.

    with clear_environment():
        assert "PATH" not in os.environ
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
