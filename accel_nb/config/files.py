"""Where the launch config file lives and how its YAML mapping is read and written (atomically).

``$ACCEL_NB_CONFIG_FILE``, else the per-user file, else the reference library's file is read;
writes go to accel_nb's own file through :func:`accel_nb.atomic_files.atomic_write_bytes`.
This module knows files and YAML, not ``LaunchConfig`` (``load_config``/``save_config`` in
:mod:`accel_nb.config.launch_config` turn the mapping into one and back).

    found = find_config_file()       # None when there is no file
    data = read_config_mapping(found)
"""

from __future__ import annotations

import os
from typing import Any

from ..atomic_files import atomic_write_bytes
from .values import CONFIG_FILE_ENV, CONFIG_FILE_NAME, ConfigFileError

__all__ = [
    "default_config_path",
    "reference_config_path",
    "find_config_file",
    "read_config_mapping",
    "write_config_mapping",
]


def default_config_path() -> str:
    """Where accel_nb keeps the launch config: ``$ACCEL_NB_CONFIG_FILE``, else the per-user config dir.

    default_config_path()   # e.g. ~/.config/accel_nb/default_config.yaml
    """
    override = os.environ.get(CONFIG_FILE_ENV)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    if os.name == "nt":
        base = os.environ.get("APPDATA") or os.path.expanduser("~\\AppData\\Roaming")
    else:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "accel_nb", CONFIG_FILE_NAME)


def reference_config_path() -> str | None:
    """The reference library's default config file, if the user has one (read when accel_nb has none)."""
    cache = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    for name in ("default_config.yaml", "default_config.json"):
        candidate = os.path.join(cache, "accelerate", name)
        if os.path.isfile(candidate):
            return candidate
    return None


def find_config_file(path: str | None = None) -> str | None:
    """The file ``load_config(path)`` reads: ``path``; else accel_nb's file; else the reference's; else None."""
    if path is not None:
        return os.path.abspath(os.path.expanduser(path)) if os.path.exists(os.path.expanduser(path)) else None
    own = default_config_path()
    if os.path.exists(own):
        return own
    if os.environ.get(CONFIG_FILE_ENV):
        return None  # an explicit location: never read some other file instead
    return reference_config_path()


def read_config_mapping(found: str) -> dict[str, Any]:
    """The YAML mapping in the config file ``found``; ``ConfigFileError`` when it is unreadable, empty or not a mapping."""
    import yaml  # deferred: import time (yaml only when a file is read or written)

    try:
        with open(found, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigFileError(found, f"cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigFileError(
            found,
            f"is not valid YAML ({problem} at {where}); fix that line, or delete the file and run "
            "`accel-nb config default`",
        ) from None
    if data is None:
        raise ConfigFileError(found, "is empty; run `accel-nb config default` to write a config")
    if not isinstance(data, dict):
        raise ConfigFileError(found, f"must be a mapping of key: value lines, not a {type(data).__name__}")
    return data


def write_config_mapping(target: str, data: dict[str, Any]) -> None:
    """Write ``data`` as YAML to ``target`` atomically (temp file + rename), creating its folder."""
    import yaml  # deferred: import time (yaml only when a file is read or written)

    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    atomic_write_bytes(target, text.encode("utf-8"), mode=0o644)
