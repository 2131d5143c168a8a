"""The numeric metrics each rank reported during a launch, kept as (x, y) series for live curves.

``Accelerator.log`` values are placed at their ``step`` (or the rank's count of log calls);
``set_postfix`` values travel with progress updates and are placed at a step that keeps counting across
the bars of one description (epoch 2's bar goes on where epoch 1's ended).
Each series keeps at most ``max_points`` points: when full, every other point is dropped
(the curve keeps its shape; the first and newest points are always kept).

    history = MetricHistory()
    history.add(0, {"loss": 0.5}, x=3)
    history.series("loss")      # {0: [(3.0, 0.5)]}
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MetricHistory"]

MAX_POINTS = 1000  # per rank and metric


def _number(value: Any) -> float | None:
    """``value`` as a finite-or-not float, or None for what is not a number (text, lists)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


class MetricHistory:
    """Per metric name, per rank, the points reported so far; ``version`` moves on every change."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max(int(max_points), 4)
        self.version = 0
        self._series: dict[str, dict[int, list[tuple[float, float]]]] = {}
        self._calls: dict[int, int] = {}  # rank -> Accelerator.log calls without a step

    def add(self, rank: int, values: dict[str, Any], x: float | None = None) -> int:
        """Add one point per numeric value at ``x`` (None: this rank's next call number); returns how many."""
        if x is None:
            x = self._calls.get(rank, 0)
            self._calls[rank] = x + 1
        added = 0
        for name, value in values.items():
            y = _number(value)
            if y is None or math.isnan(y):
                continue
            points = self._series.setdefault(str(name), {}).setdefault(int(rank), [])
            if points and points[-1][0] == x:  # the same position again (a repeated postfix): keep the newest
                points[-1] = (float(x), y)
            else:
                points.append((float(x), y))
                if len(points) > self.max_points:  # halve, keeping the first and the newest point
                    points[:] = points[::2] + ([points[-1]] if len(points) % 2 == 0 else [])
            added += 1
        if added:
            self.version += 1
        return added

    def names(self) -> list[str]:
        """Metric names in the order they were first reported."""
        return list(self._series)

    def series(self, name: str) -> dict[int, list[tuple[float, float]]]:
        """``{rank: [(x, y), ...]}`` for one metric (copies)."""
        return {rank: list(points) for rank, points in sorted(self._series.get(name, {}).items())}

    def __bool__(self) -> bool:
        return bool(self._series)
