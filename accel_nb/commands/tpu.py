"""``accel-nb tpu-config``: run set-up commands on every worker of a Cloud TPU VM pod (through ``gcloud``).

The commands come from ``--command`` (repeatable), ``--command_file`` or the config file's ``commands`` /
``command_file``; the TPU from ``--tpu_name``/``--tpu_zone`` or the config's ``tpu_name``/``tpu_zone``. Every
worker first changes to ``/usr/share``. ``--debug`` prints the ``gcloud`` command instead of running it.

    accel-nb tpu-config --tpu_name my-tpu --tpu_zone us-central1-a --command "pip install -r requirements.txt"
    accel-nb tpu-config --config_file my_config.yaml --debug

The reference's ``tpu_command_parser`` / ``tpu_command_launcher`` (``accelerate.commands.tpu``) are here too.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from typing import Any

from ..config import find_config_file
from ..config.command_line import PROG

__all__ = ["add_parser", "run", "tpu_command_parser", "tpu_command_launcher", "gcloud_command"]

_DESCRIPTION = "Run set-up commands on every worker of a Cloud TPU VM pod (before `accel-nb launch` there)."


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``tpu-config`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser(
            "tpu-config",
            help="run set-up commands on every worker of a Cloud TPU pod",
            description=_DESCRIPTION,
        )
    else:
        parser = argparse.ArgumentParser(f"{PROG} tpu-config", description=_DESCRIPTION)
    where = parser.add_argument_group("Which TPU (default: the config file's tpu_name and tpu_zone)")
    where.add_argument("--config_file", default=None, help="config file to read (default: the saved one)")
    where.add_argument("--tpu_name", default=None, help="name of the TPU VM")
    where.add_argument("--tpu_zone", default=None, help="zone of the TPU VM, e.g. us-central1-a")
    what = parser.add_argument_group("What runs on each worker")
    what.add_argument("--use_alpha", action="store_true", help="use `gcloud alpha` instead of `gcloud`")
    what.add_argument("--command_file", default=None, help="file with one command per line")
    what.add_argument(
        "--command", action="append", nargs="+", help="a command to run (repeat the flag for several)"
    )
    what.add_argument(
        "--install_accelerate",
        action="store_true",
        help="pip install the reference's `accelerate` package first",
    )
    what.add_argument(
        "--accelerate_version",
        default="latest",
        help="version for --install_accelerate: latest (default), dev (its git main) or a version such as 1.15.0",
    )
    what.add_argument("--debug", action="store_true", help="print the gcloud command instead of running it")
    return parser


def add_parser(sub: Any) -> None:
    """The ``tpu-config`` subcommand of the ``accel-nb`` parser."""
    tpu_command_parser(sub)


def _install_spec(version: str) -> str:
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accelerate -U"
    from packaging.version import InvalidVersion, Version  # deferred: import time (only with a version)

    try:
        Version(version)
    except InvalidVersion:
        raise ValueError(
            f"--accelerate_version {version!r} is not a version: give latest, dev or one such as 1.15.0"
        ) from None
    return f"accelerate=={version}"


def gcloud_command(args: argparse.Namespace) -> list[str]:
    """The ``gcloud compute tpus tpu-vm ssh`` command that runs ``args``' commands on every worker.

    Values missing from ``args`` are taken from the config file (``--config_file``, else the saved one if any);
    ``ValueError`` when there is still no command, TPU name or zone.
    """
    path = args.config_file or find_config_file()
    if path is not None:
        from .config.config_args import (
            load_config_from_file,
        )  # deferred: import time (torch, only with a file)

        defaults = load_config_from_file(path)
        if not args.command_file and not args.command and getattr(defaults, "command_file", None):
            args.command_file = defaults.command_file
        if not args.command and getattr(defaults, "commands", None):
            args.command = defaults.commands
        args.tpu_name = args.tpu_name or getattr(defaults, "tpu_name", None)
        args.tpu_zone = args.tpu_zone or getattr(defaults, "tpu_zone", None)
    if args.command_file:
        with open(args.command_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    elif args.command:
        lines = [" ".join(c) if isinstance(c, list) else str(c) for c in args.command]
    else:
        raise ValueError(
            "nothing to run: give --command (repeatable) or --command_file, or commands in the config"
        )
    for flag, value in (("--tpu_name", args.tpu_name), ("--tpu_zone", args.tpu_zone)):
        if not value:
            raise ValueError(f"which TPU? give {flag} (or {flag[2:]} in the config file)")
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_install_spec(args.accelerate_version)}")
    remote = "; ".join(steps + lines)
    gcloud = ["gcloud", "alpha"] if args.use_alpha else ["gcloud"]
    return (
        gcloud
        + ["compute", "tpus", "tpu-vm", "ssh", args.tpu_name, "--zone", args.tpu_zone]
        + [
            "--command",
            remote,
            "--worker",
            "all",
        ]
    )


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Run (or with ``--debug`` print) the ``gcloud`` command of :func:`gcloud_command`.

    Raises ``FileNotFoundError`` when ``gcloud`` is not installed and ``subprocess.CalledProcessError`` when it fails.
    """
    cmd = gcloud_command(args)
    if args.debug:
        print(f"Running {' '.join(cmd)}")
        return
    if shutil.which(cmd[0]) is None:
        raise FileNotFoundError(
            "gcloud (the Google Cloud CLI) is not installed here: install it, or print the command with --debug"
        )
    subprocess.run(cmd, check=True)
    print(f"{PROG} tpu-config: every worker of {args.tpu_name} ran the commands")


def run(ns: argparse.Namespace) -> int:
    """``accel-nb tpu-config``: the exit code (2 with a one-line error for missing input)."""
    try:
        tpu_command_launcher(ns)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{PROG} tpu-config: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        return exc.returncode
    return 0
