"""``accel_nb.progress(iterable)``: a tqdm-like loop wrapper that reports to the launching notebook.

Inside a launch each rank sends throttled :class:`~accel_nb.events.Progress` events (at most
about 10 a second per loop, always the first and the last one) that the parent draws as one
widget with a row per rank. Outside a launch it draws a plain one-line text bar on stderr.
Plain ``print`` keeps working in both cases.

    from accel_nb import progress
    bar = progress(train_loader, desc="train")
    for batch in bar:
        loss = step(batch)
        bar.set_postfix(loss=loss.item())
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO

from . import events as _events
from .availability import in_ipython_kernel
from .progress_format import format_progress_line, plain_value

DEFAULT_INTERVAL = 0.1  # seconds between two updates sent from one rank (<= 10 per second)
_TEXT_INTERVAL = 0.1  # seconds between two redraws of the terminal bar (a TTY)
_LOG_INTERVAL = 10.0  # seconds between two whole-line updates when stderr is not a TTY


# ----------------------------------------------------------------------------- the bar
def _this_rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


_unnamed_counter = 0


def _default_name(desc: str | None) -> str:
    global _unnamed_counter
    if desc:
        return desc
    _unnamed_counter += 1
    return f"loop{_unnamed_counter}"


class ProgressBar:
    """A loop's progress: iterate it, or ``update(n)`` it; ``set_postfix(loss=...)`` adds metrics.

    Made by :func:`progress`. Inside a launch it emits ``Progress`` events (throttled on this
    rank: the clock is read only every ``k`` steps, ``k`` adapted to the loop speed); outside a
    launch it redraws a single text line on ``file`` (stderr by default).
    """

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        desc: str | None = None,
        total: int | None = None,
        name: str | None = None,
        every: float | None = None,
        file: TextIO | None = None,
        disable: bool = False,
    ) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.iterable = iterable
        self.desc = desc
        self.total = None if total is None else int(total)
        self.name = name or _default_name(desc)
        self.interval = DEFAULT_INTERVAL if every is None else float(every)
        self.metrics: dict[str, Any] = {}
        self.n = 0
        self.rank = _this_rank()
        self.disable = disable
        self.closed = False
        self._in_launch = _events.in_launch()
        self._file = file
        self._tty = False
        if not self._in_launch and not disable:
            stream = file if file is not None else sys.stderr
            self._tty = bool(getattr(stream, "isatty", lambda: False)()) or in_ipython_kernel()
        self._start = time.monotonic()
        self._last_time = self._start  # when the last update was sent / drawn
        self._last_n = 0
        self._rate: float | None = None
        self._next_check = 1  # step count at which the clock is read next (first step: always)
        self._stride = 1  # steps between two clock reads, adapted to the loop speed
        self._sent_any = False
        self._line_len = 0

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("progress() was made without an iterable; use update(n) instead")
        if self.disable:
            yield from self.iterable
            return
        if not self._sent_any:  # announce the loop at 0/total (an outer loop shows while its first pass runs)
            self._send(done=False)
        n = self.n
        next_check = self._next_check
        last = self.total  # the final step is sent once, by close(), with done=True
        try:
            for item in self.iterable:
                yield item
                n += 1
                self.n = n  # always current (a few ns); the clock is read only at checks
                if n >= next_check and n != last:
                    self._checkpoint()
                    next_check = self._next_check
        finally:  # exhausted, ``break`` or an exception in the body: the loop is over either way
            self.n = n
            self.close()

    def __len__(self) -> int:
        if self.total is not None:
            return self.total
        return len(self.iterable)  # type: ignore[arg-type]

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ProgressBar {self.name!r} {format_progress_line(self.n, self.total, self._rate, self.metrics)}>"

    # -- manual use ----------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        """Advance by ``n`` steps (for loops that do not iterate the bar)."""
        self.n += n
        if not self.disable and self.n >= self._next_check:
            self._checkpoint()

    def set_postfix(
        self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = False, **metrics: Any
    ) -> None:
        """Attach metrics (``loss=0.3``) shown next to this rank's bar; sent with the next update."""
        self.metrics = {**ordered_dict, **metrics} if ordered_dict else metrics
        if refresh:
            self.refresh()

    def set_metrics(self, metrics: Mapping[str, Any] | None = None, **more: Any) -> None:
        """Same as :meth:`set_postfix`: replace the metrics shown with this loop."""
        # kept as given (cheap on every step); tensors become numbers only when an update is sent
        self.metrics = {**metrics, **more} if metrics else more

    def set_description(self, desc: str | None = None, refresh: bool = False) -> None:
        """Change the text shown before the bar."""
        self.desc = desc
        if refresh:
            self.refresh()

    def refresh(self) -> None:
        """Send / draw the current state now, ignoring the throttle."""
        if not self.disable:
            self._send(done=False)

    def close(self) -> None:
        """End the loop: sends the final state with ``done=True`` (the loop is over, whatever the
        reason: exhausted, ``break``, an exception; a failure arrives separately); idempotent."""
        if self.closed:
            return
        self.closed = True
        if not self.disable:
            self._send(done=True)

    # -- throttle ------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        """Called every ``_stride`` steps: read the clock; send when ``interval`` has passed."""
        now = time.monotonic()
        elapsed = now - self._last_time
        if not self._sent_any or elapsed >= self.interval:
            self._send(done=False, now=now)
        else:
            # read the clock about 20 times per interval, whatever the loop speed
            steps = self.n - self._last_n
            if steps > 0 and elapsed > 0:
                per_step = elapsed / steps
                self._stride = max(1, min(int(self.interval / 20 / per_step), 1 << 20))
        self._next_check = self.n + self._stride

    def _send(self, done: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        dt = now - self._last_time
        steps = self.n - self._last_n
        if steps > 0 and dt > 0:
            inst = steps / dt
            self._rate = inst if self._rate is None else 0.3 * inst + 0.7 * self._rate
        elif self._rate is None and self.n > 0 and now > self._start:
            self._rate = self.n / (now - self._start)
        self._last_time, self._last_n = now, self.n
        self._next_check = self.n + self._stride
        first = not self._sent_any
        self._sent_any = True
        if self._in_launch:
            _events.emit(
                _events.Progress(
                    rank=self.rank,
                    name=self.name,
                    n=self.n,
                    total=self.total,
                    metrics={k: plain_value(v) for k, v in self.metrics.items()},
                    desc=self.desc,
                    rate=self._rate,
                    done=done,
                )
            )
        else:
            self._draw(done, now, first)

    def _draw(self, done: bool, now: float, first: bool) -> None:
        stream = self._file if self._file is not None else sys.stderr
        line = format_progress_line(
            self.n, self.total, self._rate, self.metrics, self.desc, elapsed=now - self._start
        )
        try:
            if self._tty:
                pad = " " * max(self._line_len - len(line), 0)
                stream.write("\r" + line + pad + ("\n" if done else ""))
                self._line_len = len(line)
            else:  # a log file / CI: whole lines, rarely
                if done or first or now - getattr(self, "_last_line_time", 0.0) >= _LOG_INTERVAL:
                    stream.write(line + "\n")
                    self._last_line_time = now
            stream.flush()
        except (ValueError, OSError):  # closed stream: progress must never break the loop
            pass


def progress(
    iterable: Iterable[Any] | None = None,
    desc: str | None = None,
    total: int | None = None,
    name: str | None = None,
    every: float | None = None,
    **kwargs: Any,
) -> ProgressBar:
    """Wrap a loop so each rank's progress shows in the launching notebook (tqdm-like).

    ``name`` identifies the loop in events (default: ``desc``); ``every`` is the minimum number of
    seconds between two updates sent from this rank (default 0.1). Extra keywords: ``file``,
    ``disable``.

        for batch in progress(loader, desc="train"):
            ...
        with progress(total=100, desc="eval") as bar:
            bar.update(10)
    """
    return ProgressBar(iterable, desc=desc, total=total, name=name, every=every, **kwargs)
