"""The tracker interface (start, store config, log, finish) and the value cleaning every tracker shares.

Example:
    class PrintTracker(GeneralTracker):
        name = "print"

        def log(self, values, step=None, **kwargs):
            print(step, values)

    accelerator = Accelerator(log_with=PrintTracker())
"""

from __future__ import annotations

import dataclasses
import enum
import os
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["GeneralTracker", "InactiveTracker", "flatten_config", "scalar_groups", "scalar_values"]

_SCALARS = (bool, int, float, str)


class GeneralTracker:
    """Base class of every tracker: subclass it, set ``name`` and implement :meth:`log`.

    ``start`` opens the run, ``store_init_configuration`` records the hyper-parameters,
    ``log`` records one step's values, ``finish`` closes the run; ``tracker`` is the
    underlying run object (``accelerator.get_tracker(name, unwrap=True)`` returns it).
    ``main_process_only = False`` makes the Accelerator call the tracker on every process.

        class ListTracker(GeneralTracker):
            name = "list"

            def __init__(self):
                self.rows = []

            def log(self, values, step=None, **kwargs):
                self.rows.append((step, dict(values)))
    """

    name: str = ""
    requires_logging_directory: bool = False
    main_process_only: bool = True

    @property
    def tracker(self) -> Any:
        """The underlying run object (the tracker itself unless a subclass says otherwise)."""
        return self

    def start(self) -> None:
        """Open the run (called once by ``Accelerator.init_trackers``)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyper-parameters (flat: ``{"optim/lr": 0.1}``)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``; subclasses must implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement log(values, step=None, **kwargs)")

    def finish(self) -> None:
        """Close the run (called by ``Accelerator.end_training``)."""


class InactiveTracker(GeneralTracker):
    """What ``get_tracker`` gives on a process that does not log: every call does nothing.

    Example:
        accelerator.get_tracker("tensorboard", unwrap=True).add_histogram(...)  # a no-op on rank 1
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        return None

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _do_nothing


def _do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _as_scalar(value: Any) -> tuple[bool, Any]:
    """``(True, plain value)`` for what every tracker can store, else ``(False, None)``."""
    if value is None:
        return True, "None"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, _SCALARS):
        return True, value
    if isinstance(value, os.PathLike):
        return True, os.fspath(value)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)  # torch tensor / numpy value
    if hasattr(value, "item") and (numel() if callable(numel) else numel) == 1:
        return True, value.item()
    if isinstance(value, (list, tuple)) and all(
        _as_scalar(v)[0] and not isinstance(v, (list, tuple)) for v in value
    ):
        return True, str([_as_scalar(v)[1] for v in value])
    return False, None


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if type(value).__name__ == "Namespace" and hasattr(value, "__dict__"):  # argparse results
        return vars(value)
    return None


def flatten_config(config: Any, sep: str = "/") -> tuple[dict[str, Any], list[str]]:
    """Flatten ``config`` to ``{"a/b": scalar}``; returns it and the keys that were dropped.

    Nested dicts, dataclasses and argparse namespaces are flattened; one-element tensors become
    numbers, ``None`` becomes ``"None"``, lists of scalars become their text; anything else
    (a weight tensor, an object) is dropped and its key reported.

        flatten_config({"optim": {"lr": torch.tensor(0.1)}, "w": torch.ones(3)})
        # ({'optim/lr': 0.1...}, ['w (Tensor)'])
    """
    mapping = _as_mapping(config)
    if mapping is None:
        raise TypeError(
            f"config must be a dict (or a dataclass / argparse Namespace), not {type(config).__name__}"
        )
    flat: dict[str, Any] = {}
    dropped: list[str] = []

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            full = f"{prefix}{sep}{key}" if prefix else str(key)
            inner = _as_mapping(value)
            if inner is not None:
                walk(full, inner)
                continue
            ok, plain = _as_scalar(value)
            if ok:
                flat[full] = plain
            else:
                dropped.append(f"{full} ({type(value).__name__})")

    walk("", mapping)
    return flat, dropped


def scalar_values(values: Mapping[str, Any], who: str) -> dict[str, Any]:
    """``values`` flat (``{"eval": {"loss": x}}`` -> ``{"eval/loss": x}``), one-element tensors as numbers.

    Values no tracker can take (a list, a weight tensor) are dropped with a warning naming them.

        scalar_values({"loss": torch.tensor(0.5), "eval": {"acc": 0.9}}, "log")  # {'loss': 0.5, 'eval/acc': 0.9}
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{who}: values must be a dict like {{'loss': 0.5}}, not {type(values).__name__}")
    clean: dict[str, Any] = {}
    dropped: list[str] = []

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            full = f"{prefix}/{key}" if prefix else str(key)
            if isinstance(value, Mapping):
                walk(full, value)
                continue
            ok, plain = _as_scalar(value)
            if ok and value is not None and not isinstance(value, (list, tuple)):
                clean[full] = plain
            else:
                dropped.append(f"{full} ({type(value).__name__})")

    walk("", values)
    if dropped:
        warnings.warn(
            f"{who}: dropped values a tracker cannot take: {', '.join(dropped)}; log numbers, strings "
            "or one-element tensors",
            UserWarning,
            stacklevel=3,
        )
    return clean


def scalar_groups(values: Mapping[str, Any], clean: Mapping[str, Any]) -> dict[str, Any]:
    """``clean`` (``scalar_values(values)``) with each top-level dict of ``values`` kept as one group of its
    flattened entries: what a tracker that charts a dict as one plot takes (TensorBoard's ``add_scalars``).

        scalar_groups(v := {"loss": 0.5, "glue": {"acc": 0.9}}, scalar_values(v, "log"))  # {'loss': 0.5, 'glue': {'acc': 0.9}}
    """
    plain = {str(k) for k, v in values.items() if not isinstance(v, Mapping)}
    groups = sorted((str(k) for k, v in values.items() if isinstance(v, Mapping)), key=len, reverse=True)
    grouped: dict[str, Any] = {}
    for key, value in clean.items():
        group = None if key in plain else next((g for g in groups if key.startswith(g + "/")), None)
        if group is None:
            grouped[key] = value
        else:
            grouped.setdefault(group, {})[key[len(group) + 1 :]] = value
    return grouped
