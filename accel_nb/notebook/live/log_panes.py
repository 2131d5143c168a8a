"""The output panes of a launch's widget: one per rank in an accordion, each with its rank's last lines.

A pane is redrawn at most every ``PANE_INTERVAL`` seconds (the cell gets the lines at once), and only
when its rank's line count or the launch's end moved on; its title counts the lines. After a failure
the first failing rank's pane opens, and under each kept log a control shows it whole (``full_log``).
``progress_widget.WidgetReporter`` holds one and calls it from its flush, under its lock.

    panes = LogPanes(ipywidgets, 2, state.ranks, finished=False)
    panes.refresh(state.ranks, finished=False, now=time.monotonic())
    panes.accordion                                    # the ipywidgets.Accordion to show
"""

from __future__ import annotations

import os
from typing import Any

from ...launch.rank.worker import log_path
from ...progress_format import plural
from ..widget_compat import get_titles, set_titles
from .full_log import full_log_box
from .progress_html import pane_html

__all__ = ["PANE_INTERVAL", "LogPanes"]

PANE_INTERVAL = 1.0  # seconds between two refreshes of a log pane (the cell gets the lines at once)


class LogPanes:
    """Rank -> an ``ipywidgets.HTML`` pane, in one ``Accordion`` (``accordion``), rank order."""

    def __init__(self, W: Any, num_processes: int, views: dict[int, Any], finished: bool) -> None:
        self.panes: dict[int, Any] = {
            r: W.HTML(value=pane_html(views.get(r), finished)) for r in range(num_processes)
        }
        self.accordion = W.Accordion(children=[self.panes[r] for r in range(num_processes)])
        set_titles(self.accordion, [f"rank {r} output" for r in range(num_processes)])
        self.accordion.selected_index = None
        self._seen: dict[int, tuple[int, bool]] = {}  # rank -> (line count, launch over) last drawn
        self._last_refresh = 0.0

    def add(self, W: Any, ranks: list[int]) -> None:
        """Panes for ranks nobody expected (``num_processes`` was wrong); the accordion stays in rank order."""
        for r in ranks:
            self.panes[r] = W.HTML(value="")
        order = sorted(self.panes)
        self.accordion.children = tuple(self.panes[r] for r in order)
        set_titles(self.accordion, [f"rank {r} output" for r in order])

    def refresh(self, views: dict[int, Any], finished: bool, now: float, force: bool = False) -> None:
        """Redraw the panes whose rank's lines moved on, if ``PANE_INTERVAL`` passed (``force``: now)."""
        if not force and now - self._last_refresh < PANE_INTERVAL:
            return
        self._last_refresh = now
        for r, pane in self.panes.items():
            v = views.get(r)
            count = v.log_count if v else 0
            seen = (count, finished)  # an empty pane reads differently once the launch is over
            if self._seen.get(r) == seen:
                continue
            self._seen[r] = seen
            pane.value = pane_html(v, finished)
            if v is not None and count:
                titles = get_titles(self.accordion)
                idx = sorted(self.panes).index(r)
                if idx < len(titles):
                    titles[idx] = f"rank {r} output ({plural(count, 'line')})"
                    set_titles(self.accordion, titles)

    def pending(self, views: dict[int, Any], finished: bool) -> bool:
        """Whether a pane waits for its own (slower) refresh: its rank's lines moved on since it was drawn."""
        return any(r in views and self._seen.get(r) != (views[r].log_count, finished) for r in self.panes)

    def open(self, rank: int, views: dict[int, Any]) -> None:
        """Open ``rank``'s pane (the first failing rank's), never to show "no output"."""
        order = sorted(self.panes)
        view = views.get(rank)
        if rank in order and view is not None and view.log_count:
            self.accordion.selected_index = order.index(rank)

    def offer_full_logs(self, W: Any, log_dir: str) -> None:
        """Under each pane whose rank's log was kept in ``log_dir``, a control that shows it as text."""
        children = []
        for r in sorted(self.panes):
            path = log_path(log_dir, r)
            pane = self.panes[r]
            children.append(W.VBox([pane, full_log_box(W, path, r)]) if os.path.exists(path) else pane)
        self.accordion.children = tuple(children)
