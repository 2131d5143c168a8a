"""``accel-nb to-fsdp2``: turn a config file's FSDP1 ``fsdp_config`` into the FSDP2 one accel_nb runs.

Keys FSDP2 has renamed are renamed (``fsdp_sharding_strategy: FULL_SHARD`` becomes
``fsdp_reshard_after_forward: true``), FSDP1-only keys are dropped with a warning each, other keys are kept,
and ``fsdp_version: 2`` is set. A config that already says ``fsdp_version: 2`` is left as it is.

    accel-nb to-fsdp2 --config_file fsdp1.yaml --output_file fsdp2.yaml
    accel-nb to-fsdp2 --config_file my_config.yaml --overwrite

accel_nb reads an FSDP1 ``fsdp_config`` as well (as FSDP2, with a warning for each FSDP1-only key); the
converted file says what runs. The reference's names (``accelerate.commands.to_fsdp2``) are here too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..config.command_line import PROG

__all__ = [
    "FSDP1_ONLY",
    "RENAMED",
    "add_parser",
    "convert_config_to_fsdp2",
    "load_config",
    "run",
    "to_fsdp2_command",
    "to_fsdp2_command_parser",
]

logger = logging.getLogger(__name__)

# FSDP1 key -> its FSDP2 name (keys already spelt the FSDP2 way map to themselves)
RENAMED = {"fsdp_sharding_strategy": "fsdp_reshard_after_forward"}
# FSDP1 key -> why FSDP2 has no place for it
FSDP1_ONLY = {
    "fsdp_backward_prefetch": "has been removed in FSDP2",
    "fsdp_sync_module_states": "has been removed in FSDP2",
    "fsdp_use_orig_params": "has been removed in FSDP2",
    "fsdp_forward_prefetch": "is not yet implemented in FSDP2",
}
# sharding strategy -> reshard_after_forward: strategies that free the parameters after forward reshard
_RESHARDS = {
    "FULL_SHARD": True,
    "HYBRID_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a config file's mapping) with its ``fsdp_config`` converted to FSDP2, in place; returned."""
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if fsdp.get("fsdp_version", 1) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        logger.warning("If its keys are still FSDP1's, set fsdp_version: 1 in the file and run this again.")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        if key in FSDP1_ONLY:
            logger.warning(f"Argument {key} {FSDP1_ONLY[key]}, skipping this key...")
            continue
        new_key = RENAMED.get(key, key)
        if new_key == "fsdp_reshard_after_forward" and isinstance(value, str):
            value = _RESHARDS.get(value.upper(), value)
        converted[new_key] = value
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def load_config(config_file: str) -> dict[str, Any]:
    """The YAML mapping of ``config_file``; ``ValueError`` when it is empty."""
    import yaml  # deferred: import time (yaml only when a file is read)

    with open(config_file, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    if not config:
        raise ValueError(f"the config file {config_file} is empty: nothing to convert")
    return config


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``to-fsdp2`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    description = "Convert a config file's FSDP1 fsdp_config to FSDP2 (the FSDP accel_nb runs)."
    if subparsers is not None:
        parser = subparsers.add_parser(
            "to-fsdp2", help="convert a config's FSDP1 settings to FSDP2", description=description
        )
    else:
        parser = argparse.ArgumentParser(f"{PROG} to-fsdp2", description=description)
    parser.add_argument("--config_file", required=True, help="the config file to convert")
    parser.add_argument(
        "--overwrite", action="store_true", help="write the result over --config_file (or --output_file)"
    )
    parser.add_argument(
        "--output_file", default=None, help="where to write the result (needed without --overwrite)"
    )
    return parser


def add_parser(sub: Any) -> None:
    """The ``to-fsdp2`` subcommand of the ``accel-nb`` parser."""
    to_fsdp2_command_parser(sub)


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert ``args.config_file`` and write it to ``args.output_file`` (``--overwrite``: may replace a file).

    ``FileNotFoundError`` for a missing config, ``ValueError`` without a destination, ``FileExistsError`` when the
    destination exists and ``--overwrite`` is not given.
    """
    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file} not found")
    if not args.overwrite and args.output_file is None:
        raise ValueError("give --output_file, or --overwrite to replace the config file itself")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(
            f"{args.output_file} already exists: give --overwrite to replace it, or another --output_file"
        )
    config = load_config(args.config_file)
    target = args.output_file or args.config_file
    import yaml  # deferred: import time (yaml only when a file is written)

    text = yaml.safe_dump(convert_config_to_fsdp2(config), sort_keys=False)
    with open(target, "w", encoding="utf-8") as f:
        f.write(text)


def run(ns: argparse.Namespace) -> int:
    """``accel-nb to-fsdp2``: 0, or 2 with a one-line error."""
    try:
        to_fsdp2_command(ns)
    except (OSError, ValueError) as exc:
        print(f"{PROG} to-fsdp2: error: {exc}", file=sys.stderr)
        return 2
    print(f"{PROG} to-fsdp2: wrote {ns.output_file or ns.config_file}")
    return 0
