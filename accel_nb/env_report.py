"""The report to paste into a bug report: versions, hardware and the launch config in effect.

It joins :mod:`accel_nb.hardware` (what the machine has) and :mod:`accel_nb.config` (what a
launch would do), which know nothing of each other.

    from accel_nb.env_report import environment_report
    print(environment_report())          # what `accel-nb env` and `%accelerate_env` print
"""

from __future__ import annotations

import os

from .config import ConfigError, default_config_path, load_config
from .hardware import HardwareInfo, hardware_report


def environment_report(hw: HardwareInfo | None = None, config_path: str | None = None) -> str:
    """Versions, hardware and the saved launch config (a broken config file is reported, not raised).

    print(environment_report())
    """
    return "\n".join([hardware_report(hw), *config_lines(config_path)])


def config_lines(config_path: str | None = None) -> list[str]:
    """The launch-config section of the report: the file's values, 'none saved', or why it cannot be read."""
    path = config_path or default_config_path()
    if not os.path.exists(path):
        return [f"- Launch config: none saved ({path}); run `accel-nb config` to create one"]
    try:
        cfg = load_config(path)
    except ConfigError as exc:  # a broken config file is itself worth reporting
        return [f"- Launch config: could not be read: {exc}"]
    return [f"- Launch config ({path}):"] + [f"  - {k}: {v}" for k, v in cfg.to_dict().items()]
