"""Pick how a launch shows itself: a live widget in a Jupyter kernel, plain text elsewhere.

    from accel_nb.notebook.display import make_reporter
    reporter = make_reporter(2, desc="train")    # WidgetReporter in Jupyter, text otherwise
    reporter.start(2, {"desc": "train"})
    reporter.handle(event); ...; reporter.finish(ok=True)

The choice can be forced with ``progress="widget" | "text"`` or the environment variable
``ACCEL_NB_PROGRESS=widget|text`` (the argument wins).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

ENV_PROGRESS = "ACCEL_NB_PROGRESS"
_MODES = ("auto", "widget", "text")


def widget_frontend_available() -> bool:
    """True inside a Jupyter kernel (ZMQInteractiveShell) where ipywidgets imports."""
    ipython_mod = sys.modules.get("IPython")
    if ipython_mod is None:  # IPython not even loaded: certainly no kernel
        return False
    try:
        shell = ipython_mod.get_ipython()
    except Exception:  # noqa: BLE001
        return False
    if shell is None:
        return False
    # a Jupyter kernel, or a subclass of its shell (Google Colab's derives from it)
    if not any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__):
        return False
    try:
        import ipywidgets  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed / broken: fall back to text
        return False
    return True


def resolve_progress_mode(progress: Any = None) -> str:
    """``"widget"`` or ``"text"`` from the ``progress=`` argument, then ``ACCEL_NB_PROGRESS``, then the frontend."""
    mode = progress
    if mode is None or mode == "auto" or mode is True:
        env = os.environ.get(ENV_PROGRESS, "").strip().lower()
        mode = env or "auto"
    if mode is False:
        mode = "text"
    if not isinstance(mode, str) or mode.lower() not in _MODES:
        raise ValueError(
            f"progress={mode!r} is not a display mode; use 'widget', 'text' or 'auto' "
            f"(argument progress= or environment variable {ENV_PROGRESS})"
        )
    mode = mode.lower()
    if mode == "auto":
        return "widget" if widget_frontend_available() else "text"
    if mode == "widget" and not widget_frontend_available():
        return "text"  # asked for a widget where none can render: text is the honest fallback
    return mode


def make_reporter(num_processes: int, progress: Any = None, **info: Any) -> Any:
    """The Reporter for one launch (not yet started: the caller calls ``start(num_processes, info)``).

    ``progress`` may also be a ready Reporter object, which is returned unchanged.

        reporter = make_reporter(2, desc="train", launch_id="a1b2", log_dir="/tmp/logs")
    """
    if progress is not None and hasattr(progress, "handle") and hasattr(progress, "finish"):
        return progress
    mode = resolve_progress_mode(progress)
    if mode == "widget":
        from .progress_widget import WidgetReporter

        return WidgetReporter(num_processes, **info)
    return make_text_reporter(num_processes, **info)


def make_text_reporter(num_processes: int, **info: Any) -> Any:
    """The launcher's ``TextReporter`` when it exists, else a small built-in text reporter."""
    try:
        from accel_nb.launch.reporting import TextReporter  # the launcher's own
    except ImportError:
        return FallbackTextReporter(num_processes, **info)
    try:
        return TextReporter(**_accepted_kwargs(TextReporter, info))
    except TypeError:
        return TextReporter()


def _accepted_kwargs(cls: Any, info: dict[str, Any]) -> dict[str, Any]:
    import inspect

    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(info)
    return {k: v for k, v in info.items() if k in params}


class FallbackTextReporter:
    """Events as whole, rank-prefixed text lines on stdout (used until/unless the launcher's exists)."""

    def __init__(self, num_processes: int = 1, stream: Any = None, **info: Any) -> None:
        from .progress_text import ProgressTextFormatter

        self.num_processes = num_processes
        self.info = dict(info)
        self.stream = stream
        self.formatter = ProgressTextFormatter()
        self._lock = threading.Lock()

    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        stream = self.stream if self.stream is not None else sys.stdout
        with self._lock:
            stream.write("".join(line if line.endswith("\n") else line + "\n" for line in lines))
            stream.flush()

    def start(self, num_processes: int, info: dict[str, Any] | None = None) -> None:
        self.num_processes = num_processes
        self.info.update(info or {})
        self.formatter.start(num_processes, self.info)

    def handle(self, event: Any) -> None:
        self._write(self.formatter.lines_for(event))

    def finish(self, ok: bool, summary: str | None = None) -> None:
        self._write(self.formatter.finish_lines(ok, summary))
