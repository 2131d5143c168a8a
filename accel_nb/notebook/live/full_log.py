"""A "show the full log" control under a rank's output pane, once a launch kept its logs.

The log opens as text in the cell. A path printed in the output is no way to read it: JupyterLab
opens a clicked file outside the server's folder through the kernel's debugger ("Start
debugger?"), classic Notebook shows it as plain text. The control reads the file in the kernel
(its last ``MAX_BYTES`` when it is larger) when clicked, after the launch ended.

    box = full_log_box(ipywidgets, "/tmp/accel_nb-launch-x/rank1.log", rank=1)
"""

from __future__ import annotations

import html
import os
from typing import Any

MAX_BYTES = 2_000_000  # what one click shows at most: the end of the log


def log_html(path: str) -> str:
    """The log at ``path`` as a scrollable ``<pre>`` (its last ``MAX_BYTES``), or why it cannot be shown."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size > MAX_BYTES:
                f.seek(size - MAX_BYTES)
            data = f.read()
    except OSError as exc:
        return (
            f"<i style='color:#b71c1c'>the log {html.escape(path)} cannot be read ({html.escape(str(exc))}); "
            "logs are kept only after a failure or dropped output (ACCEL_NB_KEEP_LOGS=1 keeps them always)</i>"
        )
    text = data.decode("utf-8", errors="replace")
    head = f"... the first {size - MAX_BYTES} bytes are not shown ...\n" if size > MAX_BYTES else ""
    return (
        f"<div style='color:#616161;font-size:12px'>{html.escape(path)} ({size} bytes)</div>"
        "<pre style='max-height:30em;overflow:auto;margin:0;font-size:12px;line-height:1.3'>"
        + html.escape(head + text)
        + "</pre>"
    )


def full_log_box(widgets: Any, path: str, rank: int) -> Any:
    """A button that shows rank ``rank``'s whole log (``path``) below it, as text."""
    button = widgets.Button(description=f"Show rank {rank}'s full log", layout=widgets.Layout(width="auto"))
    button.add_class("accel-nb-full-log-button")
    view = widgets.HTML(value="")
    view.add_class("accel-nb-full-log")

    def show(_: Any) -> None:
        view.value = log_html(path)
        button.layout.display = "none"

    button.on_click(show)
    return widgets.VBox([button, view])
