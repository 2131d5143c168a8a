"""Experiment tracking: the main process sends ``accelerator.log`` to TensorBoard, MLflow, W&B, Comet or your own tracker.

    accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
    accelerator.init_trackers("mnist", config={"lr": 0.1, "optim": {"betas": (0.9, 0.99)}})
    accelerator.log({"loss": loss}, step=step)      # only process 0 writes; other ranks do nothing
    accelerator.end_training()

This module holds the name table and the Accelerator's glue; ``base`` the tracker interface,
``builtin`` the trackers shipped. Tracker packages are imported only when a run starts.
"""

from __future__ import annotations

import enum
import importlib.util
import warnings
from typing import Any

from ..lazy_exports import lazy_exports
from ..reexports import reexports
from .base import GeneralTracker, InactiveTracker, flatten_config, scalar_groups, scalar_values
from .builtin import CometMLTracker, MLflowTracker, TensorBoardTracker, WandBTracker
from .registry import BUILTIN_CLASSES, LOGGER_TYPE_TO_CLASS, make_tracker, register_tracker_class, shipped
from .unshipped import (
    AimTracker,
    ClearMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
    unshipped_message,
)

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "available_trackers",
    "flatten_config",
    "register_tracker_class",
    "resolve_log_with",
    "start_trackers",
]


class LoggerType(str, enum.Enum):
    """The tracker names the reference library knows (plain strings work too).

    TENSORBOARD, MLFLOW, WANDB, COMETML and ALL are built in; the others are an error that says how to
    connect them with a GeneralTracker.
    """

    ALL = "all"
    TENSORBOARD = "tensorboard"
    MLFLOW = "mlflow"
    WANDB = "wandb"
    AIM = "aim"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

    def __str__(self) -> str:
        return self.value


# accel_nb's built-in tracker names -> (module that must be importable, pip extra); the class behind each
# name is LOGGER_TYPE_TO_CLASS's (accel_nb.tracking.registry), which register_tracker_class extends
_BUILTIN: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
    "comet_ml": ("comet_ml", "comet_ml"),
}


_warned: set[str] = set()  # warnings given once per process


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked import (sys.modules[name] = None) or a broken install
        return False


def available_trackers() -> list[str]:
    """The built-in tracker names whose package is installed here.

    Example:
        available_trackers()   # e.g. ['tensorboard', 'mlflow']
    """
    return [name for name, (module, _) in _BUILTIN.items() if _installed(module)]


def _one_name(item: Any) -> str:
    name = str(item.value if isinstance(item, enum.Enum) else item)
    if name not in LOGGER_TYPE_TO_CLASS:
        name = name.lower()
    if shipped(name) or name == "all":
        return name
    if name in LOGGER_TYPE_TO_CLASS:
        raise ValueError(f"log_with={name!r}: {unshipped_message(name)}")
    known = sorted(n for n in LOGGER_TYPE_TO_CLASS if shipped(n))
    raise ValueError(f"log_with={item!r} names no tracker; use one of {known}, 'all' or a GeneralTracker")


def resolve_log_with(log_with: Any, logging_dir: str | None) -> list[Any]:
    """The trackers ``Accelerator(log_with=...)`` asks for: names of installed built-ins and tracker instances.

    A name whose package is missing is an error naming the pip extra; ``"all"`` means every
    installed built-in tracker.

        resolve_log_with(["tensorboard", MyTracker()], "runs")   # ['tensorboard', <MyTracker>]
    """
    if log_with is None:
        return []
    items = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    chosen: list[Any] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            if not isinstance(getattr(item, "name", None), str) or not item.name:
                raise ValueError(
                    f"{type(item).__name__} needs a class attribute name = '...' (how get_tracker finds it)"
                )
            chosen.append(item)
            continue
        if isinstance(item, type) and issubclass(item, GeneralTracker):
            raise TypeError(f"log_with: pass an instance, {item.__name__}(...), not the class")
        if not isinstance(item, (str, enum.Enum)):
            raise TypeError(
                f"log_with takes tracker names or GeneralTracker instances, not {type(item).__name__}"
            )
        name = _one_name(item)
        names = available_trackers() if name == "all" else [name]
        if name == "all" and not names:
            first, *others = (extra for _, extra in _BUILTIN.values())
            warnings.warn(
                f"log_with='all' found no tracker installed: pip install 'accel_nb[{first}]' "
                f"(or {' / '.join(others)})",
                UserWarning,
                stacklevel=3,
            )
        for one in names:
            if LOGGER_TYPE_TO_CLASS[one] is BUILTIN_CLASSES.get(one) and not _installed(_BUILTIN[one][0]):
                module, extra = _BUILTIN[one]
                raise ImportError(
                    f"log_with={one!r} needs the {module} package, which is not installed: "
                    f"pip install 'accel_nb[{extra}]'"
                )
            if LOGGER_TYPE_TO_CLASS[one].requires_logging_directory and logging_dir is None:
                raise ValueError(  # the reference's sentence first: code matches on it
                    f"Logging with `{one}` requires a `logging_dir` to be passed in: log_with={one!r} writes "
                    "files, give Accelerator(project_dir=...) (or ProjectConfiguration(logging_dir=...)) to say where"
                )
            if one not in chosen:
                chosen.append(one)
    return chosen


def start_trackers(
    wanted: list[Any],
    project_name: str,
    logging_dir: str | None,
    config: Any,
    init_kwargs: dict[str, dict[str, Any]] | None,
    is_main_process: bool,
) -> list[GeneralTracker]:
    """Create and start the trackers this process talks to, and store ``config`` (flattened) with each run."""
    init_kwargs = dict(init_kwargs or {})
    names = [w if isinstance(w, str) else w.name for w in wanted]
    unknown = sorted(set(init_kwargs) - set(names))
    if unknown:
        raise ValueError(f"init_kwargs has options for {unknown[0]!r}, which is not in log_with ({names})")
    flat = None
    if config is not None:
        flat, dropped = flatten_config(config)
        if dropped:
            warnings.warn(
                f"init_trackers: config values no tracker can store were dropped: {', '.join(dropped)}",
                UserWarning,
                stacklevel=3,
            )
    trackers: list[GeneralTracker] = []
    for want in wanted:
        if isinstance(want, GeneralTracker):
            if is_main_process or not want.main_process_only:
                trackers.append(want)
            continue
        if not is_main_process:
            continue
        trackers.append(make_tracker(want, project_name, logging_dir, init_kwargs.get(want, {})))
    for tracker in trackers:
        tracker.start()
        if flat is not None:
            tracker.store_init_configuration(flat)
    return trackers


def find_tracker(
    trackers: list[GeneralTracker], wanted: list[Any], name: str, unwrap: bool, started: bool
) -> Any:
    """The tracker called ``name`` (its run object with ``unwrap``); a no-op stand-in where this process does not log."""
    for tracker in trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    names = [w if isinstance(w, str) else w.name for w in wanted]
    if name not in names:
        raise ValueError(f"get_tracker({name!r}): no such tracker; log_with gave {names or 'none'}")
    if not started:
        raise ValueError(f"get_tracker({name!r}): call accelerator.init_trackers(project_name) first")
    return InactiveTracker(name)


def log_to_trackers(
    trackers: list[GeneralTracker],
    wanted: list[Any],
    values: dict[str, Any],
    step: int | None,
    log_kwargs: dict[str, dict[str, Any]] | None,
    started: bool = True,
) -> dict[str, Any]:
    """Send ``values`` to each tracker (with its ``log_kwargs``); returns the cleaned values."""
    clean = scalar_values(values, "accelerator.log")
    if wanted and not started and "log_before_init" not in _warned:
        _warned.add("log_before_init")
        names = [w if isinstance(w, str) else w.name for w in wanted]
        warnings.warn(
            f"accelerator.log() before init_trackers(): nothing goes to {names}; call "
            "accelerator.init_trackers(project_name) first",
            UserWarning,
            stacklevel=3,
        )
    if log_kwargs:
        names = [w if isinstance(w, str) else w.name for w in wanted]
        unknown = sorted(set(log_kwargs) - set(names))
        if unknown:
            raise ValueError(f"log_kwargs has options for {unknown[0]!r}, which is not in log_with ({names})")
    grouped = None
    for tracker in trackers:
        payload = clean
        if getattr(tracker, "logs_dict_groups", False):  # a top-level dict stays one group (TensorBoard)
            grouped = scalar_groups(values, clean) if grouped is None else grouped
            payload = grouped
        tracker.log(payload, step=step, **(log_kwargs or {}).get(tracker.name, {}))
    return clean


# the names the reference's module at this path has because it imports them (accel_nb.reexports)
__getattr__, __dir__ = lazy_exports(globals(), reexports(__name__))
