"""Pick how a launch shows itself: a live widget in a Jupyter kernel, plain text elsewhere.

    from accel_nb.notebook.display import make_reporter
    reporter = make_reporter(2, desc="train")    # WidgetReporter in Jupyter, TextReporter otherwise
    reporter.start(2, {"desc": "train"})
    reporter.handle(event); ...; reporter.finish(ok=True)

The choice can be forced with ``progress="widget" | "text"`` or the environment variable
``ACCEL_NB_PROGRESS=widget|text`` (the argument wins).
"""

from __future__ import annotations

import os
from typing import Any

from ..availability import in_ipython_kernel
from ..events import Reporter
from ..launch.parent.reporting import TextReporter

ENV_PROGRESS = "ACCEL_NB_PROGRESS"
_MODES = ("auto", "widget", "text")


def widget_frontend_available() -> bool:
    """True inside a Jupyter kernel (its shell or a subclass) where ipywidgets imports."""
    if not in_ipython_kernel():
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:  # not installed: text is what this kernel can show
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


def make_reporter(num_processes: int, progress: Any = None, **info: Any) -> Reporter:
    """The Reporter for one launch (not yet started: the caller calls ``start(num_processes, info)``).

    ``progress`` may also be a ready Reporter object, which is returned unchanged.

        reporter = make_reporter(2, desc="train", launch_id="a1b2", log_dir="/tmp/logs")
    """
    if progress is not None and hasattr(progress, "handle") and hasattr(progress, "finish"):
        return progress
    mode = resolve_progress_mode(progress)
    if mode == "widget":
        from .live.progress_widget import WidgetReporter

        return WidgetReporter(num_processes, **info)
    return TextReporter(show_ranks=info.get("show_ranks", "all"))
