"""argparse types for the flags both faces take (``accel-nb launch`` and ``%%accelerate``): counts and seconds.

The rule itself (what a whole number is) is :func:`accel_nb.counts.whole_number`; these
turn a flag's text into the value or an ``argparse.ArgumentTypeError`` the parser words.

    parser.add_argument("-n", "--num_processes", type=positive_int)
    parser.add_argument("--timeout", type=positive_seconds)
"""

from __future__ import annotations

import argparse

from ..counts import whole_number

__all__ = ["positive_int", "positive_seconds"]


def positive_int(text: str) -> int:
    """argparse type for a count: a whole number of at least 1 (``"2"`` -> 2)."""
    value = whole_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    """argparse type for a duration: a number of seconds above 0 (``"0.5"`` -> 0.5)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value
