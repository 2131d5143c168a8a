"""The Accelerator's constructor options: kwargs handlers it acts on, the project configuration,
and the compatibility warnings it gives once per process.

    handlers = handler_options([DistributedDataParallelKwargs(find_unused_parameters=True)])
    handlers.ddp        # {'find_unused_parameters': True}
"""

from __future__ import annotations

import warnings
from typing import Any

from ..checkpoint import ProjectConfiguration
from ..kwargs_handlers import HandlerArguments, read_kwargs_handlers

__all__ = ["handler_options", "project_configuration", "warn_once"]

_warned: set[str] = set()  # keys already warned about in this process


def warn_once(key: str, message: str) -> None:
    """Warn with ``message`` the first time ``key`` comes up in this process."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


def handler_options(
    handlers: list[Any] | None, gradient_accumulation_plugin: Any = None, gradient_accumulation_steps: int = 1
) -> HandlerArguments:
    """The kwargs handlers' options that accel_nb acts on; a clear error for the ones it would ignore.

    ``AutocastKwargs`` sets the autocast arguments, ``ProfileKwargs`` is kept for
    ``accelerator.profile()``, and a ``GradientAccumulationPlugin`` (the ``gradient_accumulation_plugin``
    argument, or among the handlers) sets the accumulation.

        handler_options([AutocastKwargs(cache_enabled=False)]).autocast   # {'cache_enabled': False}
    """
    found = read_kwargs_handlers(handlers)
    if gradient_accumulation_plugin is not None:
        if found.gradient_accumulation is not None:
            raise ValueError(
                "a GradientAccumulationPlugin is both in kwargs_handlers and gradient_accumulation_plugin=; pass one"
            )
        found.gradient_accumulation = read_kwargs_handlers(
            [gradient_accumulation_plugin]
        ).gradient_accumulation
    plugin = found.gradient_accumulation
    if plugin is not None:
        if gradient_accumulation_steps != 1:
            raise ValueError(
                "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both: put the steps "
                "in GradientAccumulationPlugin(num_steps=...)"
            )
        if not plugin.adjust_scheduler:
            warn_once(
                "adjust_scheduler",
                "GradientAccumulationPlugin(adjust_scheduler=False) changes nothing in accel_nb: a prepared "
                "scheduler already steps only when the optimizer does (the learning rates are the same)",
            )
    extra = sorted(set(found.init_process_group) - {"backend", "timeout"})
    if extra:
        raise ValueError(
            f"InitProcessGroupKwargs({extra[0]}=...) is not supported: the launch environment sets the "
            "rendezvous; accel_nb honours backend and timeout"
        )
    return found


def project_configuration(project_dir: str | None, project_config: Any) -> Any:
    """``project_config`` (given ``project_dir`` when it has none), else a new ProjectConfiguration."""
    if project_config is not None:
        if project_dir is not None and getattr(project_config, "project_dir", None) is None:
            project_config.project_dir = project_dir
            if getattr(project_config, "logging_dir", None) is None:  # as set_directories: logs go there too
                project_config.logging_dir = project_dir
        return project_config
    return ProjectConfiguration(project_dir=project_dir)
