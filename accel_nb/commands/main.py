"""The ``accel-nb`` command's parser and dispatch: ``config`` (questions), ``config default``, ``env``, ``launch``, ``migrate``.

    accel-nb config default                  # write a config for this machine, no questions
    accel-nb env                             # the report to paste into a bug report
    accel-nb launch --num_processes 2 train.py --epochs 3
    accel-nb migrate --check train.py        # what a script written for accelerate would hit

Each subcommand is one module of this package with ``add_parser(sub)`` and ``run(ns)``.
"""

from __future__ import annotations

import argparse
import sys

from ..config import ConfigError
from ..config.command_line import PROG
from . import config, env, launch, migrate

__all__ = ["build_parser", "main"]

SUBCOMMANDS = {"config": config, "env": env, "launch": launch, "migrate": migrate}


def build_parser() -> argparse.ArgumentParser:
    """The ``accel-nb`` parser: one subparser per module in ``SUBCOMMANDS``."""
    parser = argparse.ArgumentParser(prog=PROG, description="Configure and launch accel_nb training.")
    sub = parser.add_subparsers(dest="command", metavar="{config,env,launch,migrate}")
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``accel-nb`` and ``python -m accel_nb.commands``; returns the exit code."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.command in SUBCOMMANDS:
            return SUBCOMMANDS[ns.command].run(ns)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 1
