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

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


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
class Heartbeat(Event):
    """Sent periodically by a live rank; the watchdog reads progress from the other events."""

    time: float


@dataclass
class Result(Event):
    """What the launched function returned on this rank (tensors already moved to CPU)."""

    value: Any


@dataclass
class Failure(Event):
    """The function raised on this rank."""

    exc_type: str
    message: str
    traceback: str
    exception: BaseException | None = None  # the original, when it could be pickled


@dataclass
class Stacks(Event):
    """Every thread's Python stack on this rank; ``reason``: ``"hang"`` (the watchdog) or ``"interrupt"`` (stop)."""

    text: str
    reason: str = "hang"


class Reporter(Protocol):
    """What the parent's supervisor feeds. Implementations: text, list (tests), widget.

    A reporter may also define ``tick()``: the supervisor then calls it a few times a second from
    the launching thread, so what it shows moves on while no event arrives (quiet ranks).
    """

    def start(self, num_processes: int, info: dict[str, Any]) -> None: ...

    def handle(self, event: Event) -> None: ...

    def finish(self, ok: bool, summary: str | None = None) -> None: ...


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
