"""``write_basic_config``: a launch config for this machine in one call, as notebooks do before launching.

    from accel_nb.utils import write_basic_config
    write_basic_config(mixed_precision="bf16")    # one process per GPU, or one CPU process

The reference library's name and arguments; an existing file is kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..precision.setting import validate_mixed_precision
from .defaults import default_config
from .files import default_config_path
from .launch_config import save_config

__all__ = ["write_basic_config"]


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike | None = None
) -> Path | bool:
    """Write a config for this machine (every GPU, else the CPU) with ``mixed_precision``; keep an existing one.

    Returns the path written, or False (with a message) when a config file is already there. The
    default location is accel_nb's own (``accel-nb config`` and the launchers read it).

        write_basic_config(mixed_precision="fp16", save_location="launch.yaml")
    """
    mixed_precision = validate_mixed_precision(mixed_precision)
    path = (
        Path(os.path.abspath(os.path.expanduser(os.fspath(save_location))))
        if save_location
        else Path(default_config_path())
    )
    if path.exists():
        print(
            f"A config already exists at {path}; it was kept. Edit it with `accel-nb config`, or pass another "
            "save_location."
        )
        return False
    config = default_config().replace(mixed_precision=mixed_precision)
    return Path(save_config(config, str(path)))
