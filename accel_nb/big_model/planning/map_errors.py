"""The one error a device map raises when it cannot be made, does not fit the model, or names a module
that cannot be hooked; below the planner and the unit builder, so both raise it without a cycle.

    try:
        plan_device_map(model, max_memory={"cpu": "1MB"})
    except DeviceMapError as exc:
        print(exc)
"""

from __future__ import annotations

__all__ = ["DeviceMapError"]


class DeviceMapError(ValueError):
    """A device map cannot be made or does not fit the model."""
