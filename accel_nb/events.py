"""Typed events that a launched rank sends to the process that launched it.

This is the core half of the event channel (see DESIGN.md). The core only *emits*: inside a
launch, the worker entry (``accel_nb.launch``) installs a sink with :func:`set_event_sink`; outside
one there is no sink and :func:`emit` returns ``False`` so callers fall back to plain output.
The parent feeds every event it reads to a :class:`Reporter` (a widget in Jupyter, text in a
terminal, a list in tests).

    from accel_nb.events import Progress, emit
    emit(Progress(rank=0, name="train", n=10, total=100, metrics={"loss": 0.3}))
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Event:
    """Base class: every event names the rank that sent it."""

    rank: int


@dataclass
class Log(Event):
    """A chunk of a rank's output; ``stream`` is ``"stdout"`` or ``"stderr"``; whole lines."""

    stream: str
    text: str


@dataclass
class Dropped(Event):
    """``count`` lines of the rank's output were not sent so far (too fast to show); all are in ``log_path``.

    ``held``: the next ``held`` lines of the rank are the last lines of the run that was not sent (a flood's tail).
    """

    count: int
    log_path: str = ""
    held: int = 0


@dataclass
class Progress(Event):
    """Where a rank's loop named ``name`` is: ``n`` of ``total`` steps (``total`` may be None)."""

    name: str
    n: int
    total: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    desc: str | None = None
    rate: float | None = None  # steps per second, measured on the rank
    done: bool = False


@dataclass
class Metrics(Event):
    """Scalars logged by ``Accelerator.log_metrics`` / ``progress.set_metrics`` at ``step``."""

    values: dict[str, float]
    step: int | None = None


@dataclass
class Phase(Event):
    """A rank entered a lifecycle phase (``"started"``, ``"rendezvous"``, ``"running"``...)."""

    phase: str


@dataclass
class Role(Event):
    """This rank's place in the run's parallel layout, sent when its mesh is built or its pipeline stage cut.

    ``coords`` and ``sizes`` name the dimensions in mesh order (``dp_replicate``, ``dp_shard``, ``cp``,
    ``tp``; ``pp`` for a pipeline stage); ``detail``: what the stage holds, e.g. ``"layers 4-7"``.

        Role(rank=3, coords={"dp_shard": 1, "tp": 1}, sizes={"dp_shard": 2, "tp": 2}).text()   # 'dp 1 · tp 1'
    """

    coords: dict[str, int]
    sizes: dict[str, int]
    detail: str = ""
    again: bool = (
        False  # passed on by a session to a later cell's display: rows show it, text views stay quiet
    )

    def text(self) -> str:
        """The dimensions whose size is above 1, compactly: ``"dp 1 · tp 1"``, ``"pp 1/2 · layers 4-7"``.

        ``dp_replicate`` and ``dp_shard`` both read ``dp``; with both above 1 (HSDP) ``dp`` and ``shard``.
        """
        wide = [d for d, size in self.sizes.items() if size > 1]
        hybrid = "dp_replicate" in wide and "dp_shard" in wide
        names = {"dp_replicate": "dp", "dp_shard": "shard" if hybrid else "dp"}
        parts = []
        for d in wide:
            where = self.coords.get(d, 0)
            parts.append(f"pp {where}/{self.sizes[d]}" if d == "pp" else f"{names.get(d, d)} {where}")
        if self.detail:
            parts.append(self.detail)
        return " · ".join(parts)


@dataclass
class Heartbeat(Event):
    """Sent periodically by a live rank; the watchdog reads progress from the other events."""

    time: float


@dataclass
class Result(Event):
    """What the launched function returned on this rank (tensors already moved to CPU)."""

    value: Any


class FailureKind(enum.Enum):
    """How a rank failed. ``accel_nb.launch.failures`` words each kind and decides who failed first."""

    EXCEPTION = "exception"  # the function raised (``exc_type`` names the exception's class)
    EXIT_CODE = "exit_code"  # the process ended with an exit code, without a Python exception
    SIGNAL = "signal"  # the process was killed by a signal (``signal``)
    HANG = "hang"  # the hang watchdog stopped it: no progress for ``timeout`` seconds
    STUCK = "stuck"  # a session rank that answered neither SIGINT nor the closing of the group: killed
    PEER_LOST = "peer_lost"  # a collective broke because another rank went away (raised as an exception)
    INTERRUPTED = "interrupted"  # stopped by the launcher (SIGINT) after another failed or a stop


@dataclass
class Failure(Event):
    """The function raised on this rank, or (sent by the parent's supervisor) its process died.

    ``exc_type`` is the exception's class name, ``None`` when no Python exception was raised
    (``kind`` says what happened then: an exit code, a signal...).
    """

    exc_type: str | None
    message: str
    traceback: str
    exception: BaseException | None = None  # the original, when it could be pickled
    kind: FailureKind = FailureKind.EXCEPTION
    exit_code: int | None = None
    signal: int | None = None


@dataclass
class Stacks(Event):
    """Every thread's Python stack on this rank; ``reason``: ``"hang"`` (the watchdog) or ``"interrupt"`` (stop)."""

    text: str
    reason: str = "hang"


@dataclass
class DebugPrompt(Event):
    """A rank stopped in pdb (``breakpoint()``) and waits for one line typed by a person.

    ``output``: what pdb wrote since the last prompt; ``prompt``: pdb's prompt, e.g. ``"(rank 1 Pdb) "``;
    ``address``: the rank's Unix socket, where the launching process connects and sends the line.
    """

    output: str
    prompt: str
    address: str
    where: str = ""  # "file:line" of the frame pdb stopped in


SKIP_BREAKPOINT = "\x00skip"  # the launching process's answer to a ``DebugPrompt`` when nobody can type


@dataclass
class DebugState(Event):
    """A rank's debugger let its code run: ``"stepping"`` (it stops again soon) or ``"released"`` (``c``, ``q``)."""

    state: str


@runtime_checkable
class Reporter(Protocol):
    """What the parent's supervisor feeds. Implementations: text, list (tests), widget.

    ``tick()`` is optional for a reporter written elsewhere: a class that subclasses ``Reporter``
    inherits the no-op below, and the launcher wraps a reporter that has none (:func:`as_reporter`).
    """

    def start(self, num_processes: int, info: dict[str, Any]) -> None: ...

    def handle(self, event: Event) -> None: ...

    def finish(self, ok: bool, summary: str | None = None) -> None: ...

    def tick(self) -> None:
        """Called a few times a second from the launching thread, so what is shown moves on while
        no event arrives (quiet ranks). Optional: this default does nothing."""
        return None


class _WithTick(Reporter):
    """A reporter written without ``tick``: its own methods, and the default ``tick``."""

    def __init__(self, reporter: Any) -> None:
        self.reporter = reporter

    def start(self, num_processes: int, info: dict[str, Any]) -> None:
        self.reporter.start(num_processes, info)

    def handle(self, event: Event) -> None:
        self.reporter.handle(event)

    def finish(self, ok: bool, summary: str | None = None) -> None:
        self.reporter.finish(ok, summary)

    def __getattr__(self, name: str) -> Any:  # anything else the reporter offers
        return getattr(self.reporter, name)


def as_reporter(reporter: Any) -> Reporter:
    """``reporter`` as a full :class:`Reporter`: one with ``start``/``handle``/``finish`` but no ``tick`` gets the no-op one."""
    return reporter if isinstance(reporter, Reporter) else _WithTick(reporter)


_sink: Callable[[Event], None] | None = None
_sink_lock = threading.Lock()


def set_event_sink(sink: Callable[[Event], None] | None) -> None:
    """Install (or with ``None`` remove) the function that carries events to the parent."""
    global _sink
    with _sink_lock:
        _sink = sink


def in_launch() -> bool:
    """True inside a rank started by accel_nb's launcher (events reach a parent)."""
    return _sink is not None


def emit(event: Event) -> bool:
    """Send ``event`` to the parent; ``False`` when this process is not inside a launch."""
    sink = _sink
    if sink is None:
        return False
    sink(event)
    return True
