"""The tracker registry: the class behind each name ``log_with`` takes, and ``register_tracker_class`` to add
your own (the reference's ``LOGGER_TYPE_TO_CLASS``, with its meaning).

    class MyTracker(GeneralTracker):
        name = "mine"
        requires_logging_directory = False

        def __init__(self, run_name, **kwargs): ...

    register_tracker_class(MyTracker)
    accelerator = Accelerator(log_with="mine")
    accelerator.init_trackers("project")     # MyTracker("project", **init_kwargs.get("mine", {}))

A registered class is called as the reference calls it: ``cls(project_name, **kwargs)``, or
``cls(project_name, logging_dir, **kwargs)`` when ``requires_logging_directory`` is true.
"""

from __future__ import annotations

import warnings
from typing import Any

from .base import GeneralTracker
from .builtin import CometMLTracker, MLflowTracker, TensorBoardTracker, WandBTracker
from .unshipped import UNSHIPPED, AimTracker, ClearMLTracker, DVCLiveTracker, SwanLabTracker, TrackioTracker

__all__ = ["BUILTIN_CLASSES", "LOGGER_TYPE_TO_CLASS", "make_tracker", "register_tracker_class", "shipped"]

# accel_nb's own trackers: they take the logging directory whether or not they need it
BUILTIN_CLASSES: dict[str, type[GeneralTracker]] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MLflowTracker,
    "wandb": WandBTracker,
    "comet_ml": CometMLTracker,
}

# name -> tracker class, as the reference's table (its unshipped names raise when used)
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "aim": AimTracker,
    "comet_ml": CometMLTracker,
    "mlflow": MLflowTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
    "swanlab": SwanLabTracker,
    "trackio": TrackioTracker,
}


def shipped(name: str) -> bool:
    """Whether ``name`` is registered to a class that can run here (not one of the unshipped placeholders)."""
    return name in LOGGER_TYPE_TO_CLASS and LOGGER_TYPE_TO_CLASS[name] not in UNSHIPPED


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with="<tracker_class.name>"`` create ``tracker_class`` (register before the Accelerator).

    The class needs a non-empty ``name`` and a ``requires_logging_directory`` class attribute;
    registering a name again warns and replaces the earlier class (a built-in one too).

        register_tracker_class(MyTracker)
        Accelerator(log_with="mine")
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(
            f"register_tracker_class takes a GeneralTracker subclass (accel_nb.tracking.GeneralTracker), "
            f"not {tracker_class!r}"
        )
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{tracker_class.__name__} needs a non-empty class attribute name = '...': log_with uses it"
        )
    if "requires_logging_directory" not in _class_attributes(tracker_class):
        raise ValueError(
            f"{tracker_class.__name__} needs a class attribute requires_logging_directory: True if it "
            "writes under the Accelerator's logging directory (it is then passed as the second argument), "
            "else False"
        )
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"register_tracker_class: a tracker named '{name}' is already registered "
            f"({LOGGER_TYPE_TO_CLASS[name].__qualname__}); {tracker_class.__qualname__} replaces it",
            UserWarning,
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _class_attributes(tracker_class: type) -> set[str]:
    # GeneralTracker's own default does not count: the reference's base class has none
    return {key for klass in tracker_class.__mro__ if klass is not GeneralTracker for key in vars(klass)}


def make_tracker(name: str, project_name: str, logging_dir: Any, kwargs: dict[str, Any]) -> GeneralTracker:
    """The tracker ``log_with=name`` stands for, created for ``init_trackers(project_name)``."""
    tracker_class = LOGGER_TYPE_TO_CLASS[name]
    if BUILTIN_CLASSES.get(name) is tracker_class:
        return tracker_class(project_name, logging_dir, **kwargs)
    if tracker_class.requires_logging_directory:
        return tracker_class(project_name, logging_dir, **kwargs)
    return tracker_class(project_name, **kwargs)
