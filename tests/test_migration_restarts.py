"""``notebook_launcher(max_restarts=K)`` and the error of a failed launch, side by side with the reference:
each library runs the same script in a fresh interpreter (2 CPU processes, fork), whose rank 1 fails on
the first attempts; both restart every rank as torch's elastic agent does, and both raise an error that
``except ChildFailedError:`` catches when the restarts run out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiproc

SCRIPT = """
import json, os, sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
library, folder, fail_attempts, max_restarts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if library == "accelerate":
    from accelerate import notebook_launcher
else:
    from accel_nb import notebook_launcher


def train(folder, fail_attempts):
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    open(os.path.join(folder, f"ran.{attempt}.{rank}"), "w").close()
    if rank == 1 and attempt < fail_attempts:
        raise ValueError(f"boom on attempt {attempt}")


outcome = {"raised": None}
try:
    notebook_launcher(train, args=(folder, fail_attempts), num_processes=2, max_restarts=max_restarts)
except Exception as err:
    outcome = {"raised": type(err).__name__, "child_failed": isinstance(err, ChildFailedError),
               "runtime": isinstance(err, RuntimeError), "says": "boom on attempt" in str(err)}
outcome["ran"] = sorted(os.listdir(folder))
print("OUTCOME " + json.dumps(outcome))
"""


def _run(library: str, folder, fail_attempts: int, max_restarts: int) -> dict:
    folder.mkdir()
    script = folder.parent / f"{library}_{folder.name}.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "ACCEL_NB_CONFIG_FILE": str(folder.parent / "none.yaml"),
        "HF_HOME": str(folder.parent),
    }
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    args = [library, str(folder), str(fail_attempts), str(max_restarts)]
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("OUTCOME ")), None)
    assert line is not None, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    return json.loads(line[len("OUTCOME ") :])


@pytest.mark.parametrize(
    "fail_attempts,max_restarts",
    [(1, 1), (9, 1)],
    ids=["recovers-on-the-restart", "restarts-run-out"],
)
def test_max_restarts_and_the_error_match_the_reference(tmp_path, fail_attempts, max_restarts):
    ours = _run("accel_nb", tmp_path / "ours", fail_attempts, max_restarts)
    theirs = _run("accelerate", tmp_path / "theirs", fail_attempts, max_restarts)
    assert ours["ran"] == theirs["ran"] == ["ran.0.0", "ran.0.1", "ran.1.0", "ran.1.1"], (ours, theirs)
    if fail_attempts <= max_restarts:
        assert ours["raised"] is None and theirs["raised"] is None, (ours, theirs)
    else:
        assert theirs["raised"] == "ChildFailedError" and theirs["child_failed"], theirs
        # accel_nb's own error, which is also torch's ChildFailedError (and a RuntimeError, as before)
        assert ours == {**ours, "raised": "LaunchError", "child_failed": True, "runtime": True, "says": True}
