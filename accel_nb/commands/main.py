"""The ``accel-nb`` command's parser and dispatch: ``config`` (questions), ``config default``, ``env``, ``launch``,
``migrate``, ``test``, ``estimate-memory``, ``to-fsdp2``, ``tpu-config``.

    accel-nb config default                  # write a config for this machine, no questions
    accel-nb env                             # the report to paste into a bug report
    accel-nb launch --num_processes 2 train.py --epochs 3
    accel-nb migrate --check train.py        # what a script written for accelerate would hit
    accel-nb test                            # a short launch that checks the config works
    accel-nb estimate-memory ./my_model      # memory to load and train a model (config.json only)

Each subcommand is one module of this package with ``add_parser(sub)`` and ``run(ns)``.
"""

from __future__ import annotations

import argparse
import sys

from ..config import ConfigError
from ..config.command_line import PROG
from . import config, env, estimate, launch, migrate, test, to_fsdp2, tpu

__all__ = ["build_parser", "main"]

SUBCOMMANDS = {
    "config": config,
    "env": env,
    "launch": launch,
    "migrate": migrate,
    "test": test,
    "estimate-memory": estimate,
    "to-fsdp2": to_fsdp2,
    "tpu-config": tpu,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``accel-nb`` parser: one subparser per module in ``SUBCOMMANDS``."""
    parser = argparse.ArgumentParser(prog=PROG, description="Configure and launch accel_nb training.")
    sub = parser.add_subparsers(dest="subcommand", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``accel-nb`` and ``python -m accel_nb.commands``; returns the exit code."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        if ns.subcommand in SUBCOMMANDS:
            return SUBCOMMANDS[ns.subcommand].run(ns)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 1
