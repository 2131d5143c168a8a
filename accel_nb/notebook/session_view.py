"""``accel_nb.Session``: warm workers that keep their state across cells, with the notebook's display.

    from accel_nb import Session

    with Session(num_processes=2, cpu=True) as s:
        s.run("from accel_nb import PartialState; rank = PartialState().process_index")
        s.run("rank * 10")            # [0, 10]
        s.push(lr=0.1)
        s.pull("rank", rank=1)        # 1

Each command shows itself as a launch does (a live widget in Jupyter, text elsewhere). The
workers start with an empty namespace; ``push`` sends notebook values (cloudpickled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
from typing import Any

from ..byte_sizes import human_bytes
from ..events import Reporter
from ..launch.options import LaunchOptions
from ..launch.session.warm_session import SessionError, WarmSession
from .display import make_reporter, resolve_progress_mode, widget_frontend_available
from .launcher import reject_unknown_options

__all__ = ["Session", "SessionError", "show_status", "status_text"]


class Session(WarmSession):
    """N warm ranks (gloo on CPU, nccl on GPUs) with a persistent namespace each; a context manager.

    Takes the options of ``notebook_launcher`` (``num_processes``, ``mixed_precision``,
    ``start_method``, ``cpu``, ``timeout``, ``use_port``, ``env``, ``progress``, ...).

        s = Session(num_processes=2, cpu=True).start()
        s.run("x = 1")
        s.stop()
    """

    def __init__(
        self,
        num_processes: int | None = None,
        mixed_precision: str | None = None,
        start_method: str = "auto",
        cpu: bool = False,
        **options: Any,
    ) -> None:
        reject_unknown_options("Session", options)
        launch_options = LaunchOptions(
            num_processes=num_processes,
            mixed_precision=mixed_precision,
            start_method=start_method,
            cpu=cpu,
            **options,
        )
        super().__init__(launch_options, reporter_factory=self._make_reporter)

    @classmethod
    def from_options(cls, options: LaunchOptions) -> Session:
        """A session for already checked ``options`` (what ``%accelerate start`` builds)."""
        session = cls.__new__(cls)
        WarmSession.__init__(session, options, reporter_factory=session._make_reporter)
        return session

    def _make_reporter(self, num_processes: int, show_ranks: Any, title: str) -> Reporter:
        start = title == "session start"  # its widget says the workers are ready (idle), then stopped
        progress = self.options.progress
        own = hasattr(progress, "handle")  # a ready reporter object is used as it is
        extra = (
            {"idle_when_done": True}
            if start and not own and resolve_progress_mode(progress) == "widget"
            else {}
        )
        reporter = make_reporter(
            num_processes, progress=self.options.progress, show_ranks=show_ranks, title=title, **extra
        )
        if start:
            self._start_view = reporter
        return reporter

    def show_roles(self, roles: dict[int, Any]) -> None:
        """The session start's view (its rows stay in the start cell) shows the roles a later cell built."""
        view = getattr(self, "_start_view", None)
        if view is None or not hasattr(view, "mark_session_stopped"):  # the widget's view only
            return
        for role in roles.values():
            with contextlib.suppress(Exception):  # an old view that cannot update: the cell itself went fine
                view.handle(dataclasses.replace(role, again=True))

    def on_command(self, label: str | None) -> None:
        """The start cell's rows follow the session: running while a cell runs on the workers, then idle."""
        view = getattr(self, "_start_view", None)
        if hasattr(view, "mark_session_busy"):
            with contextlib.suppress(Exception):  # an old view that cannot update: the cell itself goes on
                view.mark_session_busy(label, self.cell)

    def stop(self) -> None:
        super().stop()
        view, self._start_view = getattr(self, "_start_view", None), None
        if hasattr(view, "mark_session_stopped"):
            view.mark_session_stopped()

    def show_status(self) -> None:
        """Show ``status()`` as a table: a widget in Jupyter, text elsewhere."""
        show_status(self)

    def __repr__(self) -> str:
        return f"<Session: {self.describe()}>"


def status_text(session: WarmSession) -> str:
    """The session's state and one line per rank: pid, device, resident memory, state."""
    lines = [session.describe()]
    rows = session.status()
    if rows:
        roles = any(row.get("role") for row in rows)  # a column once a cell built a parallel layout
        width = max(len(str(row["state"])) for row in rows) if roles else 0
        lines.append(
            f"{'rank':>4}  {'pid':>7}  {'device':<8}  {'memory':>9}  {'state':<{width}}"
            + ("  role" if roles else "")
        )
        for row in rows:
            memory = human_bytes(row["memory"]) if row["memory"] is not None else "-"
            line = (
                f"{row['rank']:>4}  {row['pid']:>7}  {row['device']:<8}  {memory:>9}  {row['state']:<{width}}"
            )
            lines.append(line + (f"  {row['role']}" if roles else ""))
    return "\n".join(lines)


def status_html(session: WarmSession) -> str:
    """The same table as ``status_text``, as HTML for the status widget."""
    rows = session.status()
    roles = any(r.get("role") for r in rows)  # a column once a cell built a parallel layout
    cells = "".join(
        "<tr>"
        + "".join(
            f"<td style='padding:0 8px'>{html.escape(str(v))}</td>"
            for v in (
                r["rank"],
                r["pid"],
                r["device"],
                human_bytes(r["memory"]) if r["memory"] is not None else "-",
                r["state"],
                *([r.get("role", "")] if roles else []),
            )
        )
        + "</tr>"
        for r in rows
    )
    columns = ("rank", "pid", "device", "memory (RSS)", "state", *(["role"] if roles else []))
    head = "".join(f"<th style='padding:0 8px'>{h}</th>" for h in columns)
    return (
        f"<div class='accel-nb-session'><b>{html.escape(session.describe())}</b>"
        f"<table><tr>{head}</tr>{cells}</table></div>"
    )


def show_status(session: WarmSession) -> None:
    """Display the status table: an ``ipywidgets.HTML`` in a Jupyter kernel, printed text elsewhere."""
    if widget_frontend_available():
        import ipywidgets
        from IPython.display import display

        display(ipywidgets.HTML(value=status_html(session)))
        return
    print(status_text(session))
