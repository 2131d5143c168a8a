"""The reference's trackers accel_nb does not ship (Aim, ClearML, DVCLive, SwanLab, Trackio): importable names
that say, when used, how to connect the service with a GeneralTracker subclass.

    from accel_nb.tracking import AimTracker   # imports
    AimTracker("run")                           # NotImplementedError naming the way out
"""

from __future__ import annotations

from typing import Any

from .base import GeneralTracker

__all__ = ["AimTracker", "ClearMLTracker", "DVCLiveTracker", "SwanLabTracker", "TrackioTracker", "UNSHIPPED"]


def unshipped_message(name: str) -> str:
    """Why a tracker the reference has is missing here, and what to do instead."""
    return (
        f"accel_nb ships no {name} tracker; wrap its client in a GeneralTracker subclass "
        "(accel_nb.tracking.GeneralTracker, see docs/tracking.md) and pass an instance to log_with, "
        "or register the class with accel_nb.tracking.register_tracker_class"
    )


class _Unshipped(GeneralTracker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(unshipped_message(self.name))


class AimTracker(_Unshipped):
    """The reference's Aim tracker; not shipped (instantiating it says what to do instead)."""

    name = "aim"
    requires_logging_directory = True


class ClearMLTracker(_Unshipped):
    """The reference's ClearML tracker; not shipped (instantiating it says what to do instead)."""

    name = "clearml"


class DVCLiveTracker(_Unshipped):
    """The reference's DVCLive tracker; not shipped (instantiating it says what to do instead)."""

    name = "dvclive"


class SwanLabTracker(_Unshipped):
    """The reference's SwanLab tracker; not shipped (instantiating it says what to do instead)."""

    name = "swanlab"


class TrackioTracker(_Unshipped):
    """The reference's Trackio tracker; not shipped (instantiating it says what to do instead)."""

    name = "trackio"


UNSHIPPED: tuple[type[GeneralTracker], ...] = (
    AimTracker,
    ClearMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)
