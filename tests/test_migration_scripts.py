"""Scripts written for accelerate run under accel_nb after renaming their imports, on 2 processes,
with the same results (examples/from_accelerate/)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.dist_helpers import free_port

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "examples", "from_accelerate")
_IMPORT_LINE = re.compile(r"^(\s*(?:from|import)\s+)accelerate\b", re.M)


def rename_imports(source: str) -> str:
    """``from accelerate... import`` / ``import accelerate...`` -> accel_nb; nothing else changes."""
    return _IMPORT_LINE.sub(r"\1accel_nb", source)


def test_rename_touches_import_lines_only():
    source = 'from accelerate.utils import set_seed\nimport accelerate\nprint("accelerate stays")\n'
    assert (
        rename_imports(source)
        == 'from accel_nb.utils import set_seed\nimport accel_nb\nprint("accelerate stays")\n'
    )


# The reference's ranks sometimes abort after their last line (gloo's threads outlive the
# interpreter while a DDP reducer still holds the group; accel_nb tears the group down at exit,
# see accel_nb.process_group). Its results are printed by then, so that abort alone is forgiven.
_EXIT_ABORT = "terminate called without an active exception"


def _run(script: str, folder: str, *args: str, forgive_exit_abort: bool = False) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",  # the reference needs it to form a CPU group; accel_nb reads it too
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "--log_dir",  # torchrun's own logs: in the test's folder, not a torchelastic_* folder left in /tmp
        os.path.join(folder, "torchrun-logs"),
    ]
    proc = subprocess.run(
        [*cmd, os.path.join(folder, script), *args], env=env, capture_output=True, text=True, timeout=240
    )
    results = [
        json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")
    ]
    aborted_at_exit = (
        forgive_exit_abort
        and proc.returncode == 1
        and _EXIT_ABORT in proc.stderr
        and "SIGABRT" in proc.stderr
    )
    assert (proc.returncode == 0 or aborted_at_exit) and len(results) == 1, (
        f"{script} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return results[0]


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _both(tmp_path, script: str, *args: str) -> tuple[dict, dict]:
    reference = tmp_path / "reference"
    renamed = tmp_path / "renamed"
    shutil.copytree(SCRIPTS, reference)
    shutil.copytree(SCRIPTS, renamed)
    source = (reference / script).read_text()
    (renamed / script).write_text(rename_imports(source))
    assert "accelerate" not in re.findall(
        r"^\s*(?:from|import)\s+(\w+)", (renamed / script).read_text(), re.M
    )
    ours = _run(script, str(renamed), *[a.replace("{run}", str(renamed)) for a in args])
    theirs = _run(
        script, str(reference), *[a.replace("{run}", str(reference)) for a in args], forgive_exit_abort=True
    )
    return ours, theirs


@pytest.mark.parametrize(
    "script, args",
    [
        ("nlp_classification.py", ()),
        ("vision_cnn.py", ("{run}/checkpoint",)),
        ("batch_size_search.py", ()),
        ("local_sgd.py", ()),
    ],
)
def test_renamed_script_gives_the_reference_results(tmp_path, script, args):
    ours, theirs = _both(tmp_path, script, *args)
    assert _same(ours, theirs), f"accel_nb {ours}\nreference {theirs}"


def test_early_stopping_with_triggers_gives_the_reference_results(tmp_path):
    ours, theirs = _both(tmp_path, "early_stopping.py")
    assert _same(ours, theirs), f"accel_nb {ours}\nreference {theirs}"
