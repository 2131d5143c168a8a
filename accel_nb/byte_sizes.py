"""Byte counts as people write and read them: ``"10GiB"`` to bytes, bytes to ``"1.5 KiB"``.

    parse_size("500MB")     # 500_000_000 (10**3 based; "2GiB" is 2**30 based)
    human_bytes(1536)       # '1.5 KiB'

Used wherever a size is taken from a user (max memory, shard sizes) or shown to one.
"""

from __future__ import annotations

import re

__all__ = ["human_bytes", "parse_size"]

_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_size(value: int | float | str, *, what: str = "size", positive: bool = False) -> int:
    """Bytes in a size: 1024, '500MB' (10**6 based), '2GiB' (2**30 based).

    parse_size("10GB")   # 10_000_000_000
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a size; use bytes (int) or a string like '10GiB'")
    if isinstance(value, (int, float)):
        result = int(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or (unit and unit not in _SIZE_UNITS):
            raise ValueError(
                f"cannot read {what} {value!r}; use bytes (int) or a size like '10GB', '500MB', '2GiB'"
            )
        result = int(float(match.group(1)) * _SIZE_UNITS[unit or "b"])
    if result < 0 or (positive and result == 0):
        raise ValueError(f"{what} must be {'positive' if positive else 'zero or more'}, got {value!r}")
    return result
