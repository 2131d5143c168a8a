"""A logger that logs once (on the main process) unless asked otherwise.

    logger = get_logger(__name__)
    logger.info("starting")                                   # main process only
    logger.info(f"rank {rank} ready", main_process_only=False) # every process
    logger.info(f"rank {rank} ready", in_order=True)           # every process, rank 0 first

Messages start with ``[RANK i]``, the process that logged them. Every logging call takes two
extra keywords: ``main_process_only`` (default True) and
``in_order`` (every process logs, one after the other in rank order, with a barrier between;
it takes precedence over ``main_process_only``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

from .lazy_exports import lazy_exports
from .reexports import reexports

__all__ = ["MultiProcessAdapter", "get_logger"]

ENV_LOG_LEVEL = "ACCEL_NB_LOG_LEVEL"
_REFERENCE_ENV_LOG_LEVEL = "ACCELERATE_LOG_LEVEL"


def _state() -> Any:
    from .state import PartialState

    return PartialState()


class MultiProcessAdapter(logging.LoggerAdapter):
    """Wraps a ``logging.Logger``; ``log`` and its shortcuts take ``main_process_only`` and ``in_order``."""

    def process(self, msg: Any, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Prefix ``msg`` with ``[RANK i]`` and default ``stacklevel`` to 2 (the caller of ``log``).

        A ``stacklevel`` passed by the caller is kept as given and counts this adapter's ``log``
        as its first frame, as in the reference: ``stacklevel=3`` from a helper names the
        helper's caller.
        """
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {_state().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` on the main process, on every process, or on every process in rank order.

        logger.log(logging.INFO, "hello", main_process_only=False)
        """
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        state = _state()
        if in_order:
            for index in range(state.num_processes):
                if index == state.process_index:
                    self.logger.log(level, msg, *args, **kwargs)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            self.logger.log(level, msg, *args, **kwargs)

    @functools.lru_cache(None)  # noqa: B019 - one entry per distinct message, like warnings' "once"
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` the first time it is called with these arguments; nothing afterwards.

        logger.warning_once("the option x is deprecated")
        """
        kwargs.setdefault("stacklevel", 3)  # name the caller of warning_once, not this module
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A ``MultiProcessAdapter`` over ``logging.getLogger(name)``.

    ``log_level`` (or the ``ACCEL_NB_LOG_LEVEL`` / ``ACCELERATE_LOG_LEVEL`` environment variable)
    sets the level of this logger and of the root logger.

        logger = get_logger(__name__, log_level="INFO")
        logger.info("loss %.3f", loss, main_process_only=True)
    """
    if log_level is None:
        log_level = os.environ.get(ENV_LOG_LEVEL) or os.environ.get(_REFERENCE_ENV_LOG_LEVEL) or None
    logger = logging.getLogger(name)
    if log_level is not None:
        level = str(log_level).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ValueError(
                f"log_level={log_level!r} is not a logging level; use DEBUG, INFO, WARNING, ERROR or CRITICAL"
            )
        logger.setLevel(level)
        logger.root.setLevel(level)
    return MultiProcessAdapter(logger, {})


# What optional libraries log when they are imported on a machine without their GPU builds: true, and
# nothing a user can act on (torchao's CUDA extension libraries, torch's note on torchao's enums,
# bitsandbytes' optional CPU kernel package, DeepSpeed falling back to its CPU accelerator).
IMPORT_NOTES = (
    ("torchao", "Failed to load "),
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
    ("DeepSpeed", "Setting accelerator to CPU"),
)


class _ImportNotes(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def quiet_import_notes() -> Iterator[None]:
    """Import optional libraries inside this block: their import-time notes (``IMPORT_NOTES``) are dropped.

        with quiet_import_notes():
            import torchao
    Only those exact notes of those loggers; any other message, warning or error still shows."""
    added = [(logging.getLogger(name), _ImportNotes(text)) for name, text in IMPORT_NOTES]
    for logger, note in added:
        logger.addFilter(note)
    try:
        yield
    finally:
        for logger, note in added:
            logger.removeFilter(note)


# the names the reference's module at this path has because it imports them (accel_nb.reexports)
__getattr__, __dir__ = lazy_exports(globals(), reexports(__name__))
