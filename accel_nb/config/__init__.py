"""The launch config: one dataclass, validated, stored as YAML in a per-user directory.

The file uses the key names and values of the reference library's ``default_config.yaml``
(``distributed_type: MULTI_GPU``, ``mixed_precision: bf16``, ``gpu_ids: all`` ...), so a config
written for it loads here unchanged. ``accel-nb config``, ``config_wizard()``, ``accel-nb launch``,
``notebook_launcher`` and ``%%accelerate`` all read the same file.

This package's ``__init__`` is the public face; the work is done in ``values`` (allowed values,
checks, errors), ``launch_config`` (the dataclass, ``load_config``/``save_config``), ``files``
(paths, YAML, atomic writes), ``defaults`` (a config for this machine), ``command_line`` (the
equivalent ``accel-nb launch`` line), ``arguments`` (argparse types both faces' flags use) and
``basic`` (``write_basic_config``).

    from accel_nb.config import load_config, save_config, default_config
    cfg = load_config() or default_config()      # the saved config, else one for this machine
    cfg.num_processes = 2
    save_config(cfg)                             # validated first, written atomically
"""

from __future__ import annotations

from ..compile.options import DYNAMO_MODES
from .command_line import launch_command_line
from .defaults import COMPUTE_KINDS, default_config, derive_distributed_type
from .files import default_config_path, find_config_file, reference_config_path
from .launch_config import LaunchConfig, load_config, save_config
from .values import (
    COMPUTE_ENVIRONMENTS,
    CONFIG_FILE_ENV,
    CONFIG_FILE_NAME,
    DISTRIBUTED_TYPES,
    DYNAMO_BACKENDS,
    LAUNCHER_RDZV_BACKENDS,
    MIXED_PRECISION_CHOICES,
    RDZV_BACKENDS,
    REFERENCE_KEYS_KEPT,
    START_METHODS,
    ConfigError,
    ConfigFileError,
    ConfigWarning,
)

__all__ = [
    "COMPUTE_ENVIRONMENTS",
    "COMPUTE_KINDS",
    "CONFIG_FILE_ENV",
    "CONFIG_FILE_NAME",
    "DISTRIBUTED_TYPES",
    "DYNAMO_BACKENDS",
    "DYNAMO_MODES",
    "LAUNCHER_RDZV_BACKENDS",
    "MIXED_PRECISION_CHOICES",
    "RDZV_BACKENDS",
    "REFERENCE_KEYS_KEPT",
    "START_METHODS",
    "ConfigError",
    "ConfigFileError",
    "ConfigWarning",
    "LaunchConfig",
    "default_config",
    "default_config_path",
    "derive_distributed_type",
    "find_config_file",
    "launch_command_line",
    "load_config",
    "reference_config_path",
    "save_config",
]
