"""The environment of a fresh interpreter that must import this very accel_nb (spawned ranks, spawn server).

Example:
    env = with_package_on_path(dict(os.environ))
    subprocess.Popen([sys.executable, "-c", "import accel_nb"], env=env)
"""

from __future__ import annotations

import os


def package_root() -> str:
    """The directory that holds the ``accel_nb`` package (a checkout or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def with_package_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``package_root()`` first on ``PYTHONPATH`` (kept: what was there before)."""
    before = env.get("PYTHONPATH")
    env["PYTHONPATH"] = package_root() + (os.pathsep + before if before else "")
    return env
