"""Test ordering and skips: fast unit tests first, then multi-process, kernel, notebook, browser."""

import os
import shutil
import sys

import pytest

from accel_nb.env_names import (
    DYNAMO_ENV,
    ENV_GRADIENT_ACCUMULATION_STEPS,
    ENV_MIXED_PRECISION,
    ENV_USE_CPU,
    REFERENCE_NAMES,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("OMP_NUM_THREADS", "1")

_STAGES = ["multiproc", "kernel", "notebooks", "browser"]


def _stage(item: pytest.Item) -> int:
    for i, name in reversed(list(enumerate(_STAGES, start=1))):
        if item.get_closest_marker(name):
            return i
    return 0


def pytest_collection_modifyitems(config, items):
    items.sort(key=_stage)  # stable: keeps file order inside a stage
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    has_chromium = shutil.which("chromium") is not None or os.path.exists("/usr/bin/chromium")
    for item in items:
        if item.get_closest_marker("gpu") and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if item.get_closest_marker("browser") and not has_chromium:
            item.add_marker(pytest.mark.skip(reason="needs Debian's chromium (scripts/test.sh installs it)"))


# environment variables a launch sets for a rank (accel_nb's names and the reference's, from their one
# home, accel_nb.env_names: light, no torch); tests of the core start without them
_LAUNCH_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    *(
        name
        for ours in (ENV_MIXED_PRECISION, ENV_GRADIENT_ACCUMULATION_STEPS, ENV_USE_CPU)
        for name in (ours, REFERENCE_NAMES[ours])
    ),
    *(name for pair in DYNAMO_ENV.values() for name in pair),
)


@pytest.fixture
def fresh_state(monkeypatch):
    """A single-process topology and forgotten PartialState/AcceleratorState/GradientState, before and after.

    Use it with ``pytestmark = pytest.mark.usefixtures("fresh_state")``; it yields ``monkeypatch``.
    """
    from accel_nb.state import _reset_all_states

    for name in _LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    _reset_all_states()
    yield monkeypatch
    _reset_all_states()
