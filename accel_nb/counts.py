"""Counts: THE rule for "a whole number >= 1" (processes, steps, buffers), in one place for every check.

    whole_number("2"), whole_number(2.0)      # 2, 2: text, YAML and flags spell a count this way
    is_count(4), is_count(True), is_count(0)  # True, False, False: a Python argument is an int proper

Two readings of one rule: ``whole_number`` reads a count from text or a config file (digits, a float
without a fraction), ``is_count`` checks an argument given in Python (an ``int``, never a bool). Each
caller words its own error (``ConfigError``, ``LaunchSetupError``, argparse, ``ValueError``).
"""

from __future__ import annotations

import operator
import re
from typing import Any

__all__ = ["is_count", "is_whole_number", "whole_number"]

_DIGITS = re.compile(r"\s*[+-]?\d+\s*")


def is_whole_number(value: Any) -> bool:
    """An ``int`` proper: not a bool, not a string or float that spells one."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any, low: int = 1) -> bool:
    """``value`` is an ``int`` (not a bool) of at least ``low``: the check of a count given in Python.

    is_count(2), is_count(0, low=0)   # True, True
    """
    return is_whole_number(value) and value >= low


def whole_number(value: Any) -> int | None:
    """``value`` as an int when it is a whole number, else None: a count read from text, a flag or a file.

    An int (or an integer-like such as numpy's), a float without a fraction, or digits in a string
    count; a bool does not.

        whole_number("2"), whole_number(2.0)    # 2, 2
        whole_number(2.5), whole_number(True)   # None, None
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        return int(value) if _DIGITS.fullmatch(value) else None
    try:
        return operator.index(value)
    except TypeError:
        return None
