"""Environment-variable helpers: set some for a block, or run a block with none.

Example:
    with patch_environment(master_port=29501, omp_num_threads=1):
        ...        # MASTER_PORT="29501", OMP_NUM_THREADS="1"; previous values back afterwards
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = [
    "are_libraries_initialized",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
]

_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")
# variables a test or a library may leave behind: the reference's prefix and accel_nb's own
_PURGED_PREFIXES = ("ACCELERATE_", "ACCEL_NB_")


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set ``KEY=str(value)`` (keys upper-cased) for the block; restore or remove them after, even on error.

    with patch_environment(foo="bar"):
        assert os.environ["FOO"] == "bar"
    """
    previous: dict[str, str | None] = {}
    for key, value in kwargs.items():
        name = key.upper()
        previous.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the whole previous environment comes back after.

    with clear_environment():
        assert "PATH" not in os.environ
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1 for 'y', 'yes', 't', 'true', 'on', '1' and 0 for their opposites (any case); True/False with ``to_bool``.

    str_to_bool("Yes"), str_to_bool("off", to_bool=True)   # 1, False
    """
    lowered = value.lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The truth value of environment variable ``key`` (read by :func:`str_to_bool`), else ``default``."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The value of environment variable ``key`` as a string, else ``str(default)``."""
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first of ``env_keys`` set to an integer of 0 or more, else ``default``.

    get_int_from_env(["LOCAL_RANK", "MPI_LOCALRANKID"], 0)
    """
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` this process has already imported."""
    return [name for name in library_names if name in sys.modules]


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``KEY=value\\n`` lines for an environment file, skipping (with a warning) entries that are empty or
    contain ``;``, a newline, ``<``, ``>`` or a space.

    convert_dict_to_env_variables({"A": "1", "B": "x y"})   # ['A=1\\n'] and a warning about B
    """
    lines = []
    for key, value in current_env.items():
        text = key + value
        if key and value and not any(ch in text for ch in ";\n<> "):
            lines.append(f"{key}={value}\n")
        else:
            # the reference's logger name (accelerate.utils.environment): code filters or asserts on it
            logging.getLogger("accel_nb.utils.environment").warning(
                f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values."
            )
    return lines


@contextlib.contextmanager
def _accelerate_variables_restored() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(_PURGED_PREFIXES)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_PURGED_PREFIXES)]:
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: ``ACCELERATE_*`` / ``ACCEL_NB_*`` variables set while the function (or each ``test*``
    method of the class and of its subclasses) runs are removed afterwards, changed ones restored.

        @purge_accelerate_environment
        class TestTraining(unittest.TestCase): ...
    """

    def wrap(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _accelerate_variables_restored():
                return func(*args, **kwargs)

        wrapper._accel_nb_env_purged = True  # type: ignore[attr-defined]
        return wrapper

    if not isinstance(func_or_cls, type):
        return wrap(func_or_cls)

    def wrap_tests(cls: type) -> type:
        for name in dir(cls):
            method = getattr(cls, name)
            if (
                name.startswith("test")
                and callable(method)
                and not getattr(method, "_accel_nb_env_purged", False)
            ):
                setattr(cls, name, wrap(method))
        return cls

    wrap_tests(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, cls)(**kwargs)
        else:
            super(func_or_cls, cls).__init_subclass__(**kwargs)
        wrap_tests(cls)

    func_or_cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    return func_or_cls
