"""``accel-nb env``: versions, hardware and the launch config in effect (the report for bug reports).

    accel-nb env                          # what `%accelerate_env` prints in a notebook

The report itself is :func:`accel_nb.env_report.environment_report`. The reference's names
(``accelerate.commands.env``: ``env_command_parser``, ``env_command``) are here too.
"""

from __future__ import annotations

import argparse
import platform
from shutil import which
from typing import Any

from ..config.command_line import PROG
from ..env_report import environment_report

__all__ = ["add_parser", "run", "env_command", "env_command_parser", "which"]


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``env`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser(
            "env", help="print versions, hardware and the launch config (for bug reports)"
        )
    else:
        parser = argparse.ArgumentParser(f"{PROG} env")
    parser.add_argument(
        "--config_file", "--config-file", default=None, help="config to report (default: the saved one)"
    )
    return parser


def add_parser(sub: Any) -> None:
    """The ``env`` subcommand of the ``accel-nb`` parser."""
    env_command_parser(sub)


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print the report; return its main facts under the reference's keys (``"PyTorch version"``, ...).

    ``"`accelerate` bash location"`` is where the ``accel-nb`` command is found on PATH ("Not found" when it is not).
    """
    import numpy as np  # deferred: import time (torch and numpy only when the report is made)
    import psutil
    import torch

    from .. import __version__

    print(environment_report(config_path=args.config_file))
    gpu = torch.cuda.is_available()
    info: dict[str, Any] = {
        "`Accelerate` version": __version__,
        "Platform": platform.platform(),
        "`accelerate` bash location": which(PROG) or "Not found",
        "Python version": platform.python_version(),
        "Numpy version": np.__version__,
        "PyTorch version": torch.__version__,
        "PyTorch accelerator": "CUDA" if gpu else "N/A",
        "System RAM": f"{psutil.virtual_memory().total / 1024**3:.2f} GB",
    }
    if gpu:
        info["GPU type"] = torch.cuda.get_device_name()
    return info


def run(ns: argparse.Namespace) -> int:
    """``accel-nb env``: print the report to paste into a bug report."""
    print(environment_report(config_path=ns.config_file))
    return 0
