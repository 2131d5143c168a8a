"""binder/ alone builds a working environment: a fresh venv, requirements.txt, postBuild, the quickstart.

No shortcut through this interpreter's packages (no --system-site-packages): pip installs
everything into the new venv (from the local wheel cache / index where the machine has one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.notebooks, pytest.mark.timeout(900)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = shutil.ignore_patterns(
    ".venv",
    ".git",
    "out",
    "artifacts",
    "_build",
    "__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
)


def copy_checkout(dest) -> None:
    """The files a clean checkout has (plus work not yet committed): nothing built, no venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if listed.returncode != 0:  # not a git checkout (an unpacked archive): copy the tree
        shutil.copytree(ROOT, dest, ignore=SKIP)
        return
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src) and not os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def run(cmd, cwd, env, timeout):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    )
    return res


def test_binder_environment_runs_the_quickstart(tmp_path):
    repo = tmp_path / "repo"
    copy_checkout(repo)
    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), OMP_NUM_THREADS="1"
    )

    run([python, "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], repo, env, 600)
    run(["bash", "binder/postBuild"], repo, env, 300)
    # the environment is self-contained: accel_nb and torch come from the new venv
    where = run(
        [python, "-c", "import accel_nb, torch, sys; print(accel_nb.__file__, torch.__file__)"],
        repo,
        env,
        120,
    )
    assert str(repo) in where.stdout and str(venv) in where.stdout

    res = run([python, "examples/run_quickstart.py", "--out", str(tmp_path / "out")], repo, env, 600)
    assert "ranks: [0, 1]" in res.stdout
    assert "trained model (back in this notebook): Sequential" in res.stdout
    assert (tmp_path / "out" / "quickstart.ipynb").exists() and (
        tmp_path / "out" / "quickstart.html"
    ).exists()
