"""``accel-nb test``: launch a short self-check with the saved config (or ``--config_file``) to see that it works.

Every process meets the others, a collective reaches each of them, and a prepared model takes a training step
that ends with the same weights everywhere (``accel_nb.launch.rank.selfcheck``). The exit code is the launch's.

    accel-nb test
    accel-nb test --config_file my_config.yaml

The reference's names (``accelerate.commands.test``: ``test_command_parser``, ``test_command``) are here too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from ..config.command_line import PROG

__all__ = ["SELF_CHECK", "add_parser", "run", "test_command", "test_command_parser"]

SELF_CHECK = "accel_nb.launch.rank.selfcheck"


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``test`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    description = "Launch a short self-check with the launch config, to see that training will run."
    if subparsers is not None:
        parser = subparsers.add_parser(
            "test", help="launch a short self-check with the config", description=description
        )
    else:
        parser = argparse.ArgumentParser(f"{PROG} test", description=description)
    parser.add_argument("--config_file", default=None, help="config to launch with (default: the saved one)")
    return parser


def add_parser(sub: Any) -> None:
    """The ``test`` subcommand of the ``accel-nb`` parser."""
    test_command_parser(sub)


def test_command(args: argparse.Namespace) -> None:
    """Launch the self-check through ``accel-nb launch``; ``subprocess.CalledProcessError`` when it fails."""
    cmd = [sys.executable, "-m", "accel_nb.commands", "launch"]
    if args.config_file is not None:
        cmd.append(f"--config_file={args.config_file}")
    subprocess.run([*cmd, "-m", SELF_CHECK], check=True)
    print("Test is a success! You are ready for your distributed training!")


test_command.__test__ = False  # type: ignore[attr-defined]  # pytest: a command, not a test
test_command_parser.__test__ = False  # type: ignore[attr-defined]


def run(ns: argparse.Namespace) -> int:
    """``accel-nb test``: 0 when the self-check passed, else the launch's exit code."""
    try:
        test_command(ns)
    except subprocess.CalledProcessError as exc:
        print(
            f"{PROG} test: the self-check failed (exit code {exc.returncode}); its output is above",
            file=sys.stderr,
        )
        return exc.returncode
    return 0
