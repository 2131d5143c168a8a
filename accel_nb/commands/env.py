"""``accel-nb env``: versions, hardware and the launch config in effect (the report for bug reports).

    accel-nb env                          # what `%accelerate_env` prints in a notebook

The report itself is :func:`accel_nb.env_report.environment_report`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..env_report import environment_report

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """The ``env`` subcommand of the ``accel-nb`` parser."""
    env = sub.add_parser("env", help="print versions, hardware and the launch config (for bug reports)")
    env.add_argument("--config_file", "--config-file", default=None)


def run(ns: argparse.Namespace) -> int:
    """``accel-nb env``: print the report to paste into a bug report."""
    print(environment_report(config_path=ns.config_file))
    return 0
