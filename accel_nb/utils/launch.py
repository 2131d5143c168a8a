"""Shim at the reference's ``accelerate.utils.launch`` path: the environment and command a launch gives its ranks.

    from accel_nb.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

The two are accel_nb's implementations (``accel_nb.commands.launch_env``), imported on first use, as is
``SageMakerConfig`` (``accel_nb.commands.config.config_args``: read, never launched).
``mpirun_arguments`` is defined here, with ``which`` and ``subprocess`` as this module's names, because code
written for the reference patches them here (``mock.patch("accelerate.utils.launch.which")``). The reference's
other launcher internals are left out (docs/migration.md says why).
"""

from __future__ import annotations

import subprocess
from shutil import which
from typing import Any

from ..lazy_exports import lazy_exports
from ..reexports import reexports

_EXPORTS = {
    **dict.fromkeys(
        ["prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env"], "accel_nb.commands.launch_env"
    ),
    "SageMakerConfig": "accel_nb.commands.config.config_args",
}

__all__ = sorted([*_EXPORTS, "mpirun_arguments"])


def mpirun_arguments() -> tuple[str, str, str, str, str]:
    """``(program, hostfile flag, process-count flag, processes-per-node flag, bind flag)`` of the installed MPI.

    Open MPI spells them ``--hostfile -n --npernode --bind-to``; Intel MPI and MVAPICH ``-f -n -ppn`` (no bind
    flag: ``""``). ``OSError`` when neither ``mpirun`` nor ``mpiexec`` is on PATH.
    """
    found = [name for name in ("mpirun", "mpiexec") if which(name)]
    if not found:
        raise OSError("mpirun or mpiexec was not found on PATH: install Open MPI, Intel MPI or MVAPICH")
    if b"Open MPI" in subprocess.check_output([found[0], "--version"]):
        return found[0], "--hostfile", "-n", "--npernode", "--bind-to"
    return found[0], "-f", "-n", "-ppn", ""


__getattr__, __dir__ = lazy_exports(globals(), {**reexports(__name__), **_EXPORTS})


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """The reference's private helper, by its name: ``accel_nb.config.script_args.script_args_to_dict``."""
    from ..config.script_args import script_args_to_dict

    return script_args_to_dict(nargs)
