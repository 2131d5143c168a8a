"""Where the launch config lives and how it is read and written (YAML, atomically).

``$ACCEL_NB_CONFIG_FILE``, else the per-user file, else the reference library's file is read;
writes go to accel_nb's own file through :func:`accel_nb.atomic_files.atomic_write_bytes`.

    cfg = load_config()              # None when there is no file
    save_config(cfg, "my.yaml")      # validated first
"""

from __future__ import annotations

import os

from .atomic_files import atomic_write_bytes
from .config_values import CONFIG_FILE_ENV, CONFIG_FILE_NAME, ConfigFileError
from .launch_config import LaunchConfig

__all__ = ["default_config_path", "reference_config_path", "find_config_file", "load_config", "save_config"]


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


def load_config(path: str | None = None) -> LaunchConfig | None:
    """Read and validate the launch config; ``None`` when there is no file.

    cfg = load_config()              # accel_nb's file, else the reference library's
    cfg = load_config("my.yaml")
    """
    found = find_config_file(path)
    if found is None:
        return None
    import yaml

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
            found, f"is not valid YAML ({problem} at {where}); fix that line, or delete the file and run "
            "`accel-nb config default`",
        ) from None  # fmt: skip
    if data is None:
        raise ConfigFileError(found, "is empty; run `accel-nb config default` to write a config")
    if not isinstance(data, dict):
        raise ConfigFileError(found, f"must be a mapping of key: value lines, not a {type(data).__name__}")
    return LaunchConfig.from_dict(data, path=found)


def save_config(cfg: LaunchConfig, path: str | None = None) -> str:
    """Validate, then write the YAML atomically (temp file + rename); return the path written.

    An invalid config raises ``ConfigError`` and leaves any existing file untouched.
    """
    import yaml

    target = os.path.abspath(os.path.expanduser(path)) if path else default_config_path()
    cfg.validate(target)
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    atomic_write_bytes(target, text.encode("utf-8"), mode=0o644)
    cfg.source = target
    return target
