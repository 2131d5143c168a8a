"""The ranks' output as whole, rank-prefixed lines in the launching cell (or terminal).

Lines that several ranks print identically (a library warning, "loading weights...") are shown
once with the ranks that printed them: ``[ranks 0,1] text``. To see that, a line waits up to
``merge_window`` seconds for the other ranks (no wait once every rank printed it, none at all
with one rank). A flood of output that the rank dropped (too fast to show) gets one note per
rank when it begins, one before the flood's last lines (which are always shown) and one total at the
end, never a note per burst.

    relay = OutputRelay(2)
    relay.add(Log(0, "stdout", "hello\n")); relay.add(Log(1, "stdout", "hello\n"))
    # prints "[ranks 0,1] hello"
    relay.finish()
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, TextIO

from ...events import Dropped, Log
from ...progress_format import plural

MERGE_WINDOW_S = 0.5  # how long a line waits for the same line from the other ranks


def rank_label(ranks: Iterable[int]) -> str:
    """``[0]`` -> ``"[rank 0]"``, ``[0, 1, 2, 5]`` -> ``"[ranks 0-2,5]"``."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"[rank {ranks[0]}]"
    spans: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(
            str(start) if start == prev else f"{start},{prev}" if prev == start + 1 else f"{start}-{prev}"
        )
        if r is not None:
            start = prev = r
    return f"[ranks {','.join(spans)}]"


def _tail_note(event: Dropped) -> str:
    where = f" (all in {event.log_path})" if event.log_path else ""
    return (
        f"{rank_label([event.rank])} ... {plural(event.count, 'line')} not shown so far{where}; "
        f"the last {plural(event.held, 'line')} of the flood:"
    )


# torch's C++/glog-style prefix, with the rank torchrun adds: "[rank1]:W1129 06:21:38.163000 25626 "
_TORCH_LOG_PREFIX = re.compile(r"^(?:\[rank\d+\]:)?([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


def merge_key(line: str) -> str:
    """What must match for two ranks' lines to be one: the line without what differs per rank by nature
    (torch's log prefix: the rank, the time, the process id), so a warning every rank logs shows once."""
    m = _TORCH_LOG_PREFIX.match(line)
    return f"{m.group(1)} {line[m.end() :]}" if m else line


class _Pending:
    __slots__ = ("stream", "text", "ranks", "since", "whole", "key")

    def __init__(self, stream: str, text: str, rank: int, since: float, whole: bool = False) -> None:
        self.stream, self.text, self.ranks, self.since = stream, text, [rank], since
        self.whole = whole  # a line of its own (a failure): never merged, written as soon as its turn comes
        self.key = (stream, merge_key(text))


class OutputRelay:
    """Writes ``Log`` lines rank-prefixed, merging identical lines across ranks; notes dropped lines.

    ``ranks`` are the ranks whose output is shown (``None``: all of ``num_processes``); streams
    are looked up at write time (in Jupyter they belong to the cell running now) unless given.
    Thread-safe; :meth:`tick` writes lines whose wait is over, :meth:`finish` writes the rest.
    """

    def __init__(
        self,
        num_processes: int,
        ranks: set[int] | None = None,
        merge_window: float = MERGE_WINDOW_S,
        stream: TextIO | None = None,
        err_stream: TextIO | None = None,
    ) -> None:
        self.expected = len(ranks) if ranks is not None else max(int(num_processes), 1)
        self.ranks = ranks
        self.merge_window = merge_window
        self._stream = stream
        self._err_stream = err_stream
        self._queue: deque[_Pending] = deque()
        self._open: dict[tuple[str, str], _Pending] = {}  # the newest waiting entry of each line
        self._dropped: dict[int, Dropped] = {}
        self._unmerged: dict[int, int] = {}  # rank -> lines of a flood's tail still to come (never merged)
        self._lock = threading.Lock()

    def shown(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def add(self, event: Any, now: float | None = None) -> None:
        """Take a ``Log`` or ``Dropped`` event of a shown rank (others are ignored)."""
        if not self.shown(event.rank):
            return
        now = time.monotonic() if now is None else now
        if isinstance(event, Dropped):
            first = event.rank not in self._dropped
            self._dropped[event.rank] = event
            if first:
                where = f"; all of it is in {event.log_path}" if event.log_path else ""
                self._write(
                    "stderr", [f"{rank_label([event.rank])} output too fast to show: dropping lines{where}"]
                )
            if event.held:  # the flood's last lines follow: say so in their place, after the head
                with self._lock:
                    self._queue.append(_Pending("stderr", _tail_note(event), event.rank, now, whole=True))
                    self._unmerged[event.rank] = event.held  # they stay under their own note
                self.tick(now)
            return
        if not isinstance(event, Log):
            return
        with self._lock:
            for line in event.text.splitlines():
                # a flood's tail: labelled by its rank alone, after its note
                if self._unmerged.get(event.rank):
                    self._unmerged[event.rank] -= 1
                    self._queue.append(
                        _Pending(event.stream, f"{rank_label([event.rank])} {line}", event.rank, now, True)
                    )
                    continue
                entry = self._open.get((event.stream, merge_key(line)))
                if entry is not None and event.rank not in entry.ranks:
                    entry.ranks.append(event.rank)
                    entry.text = entry.key[1]  # shown once for several ranks: without one rank's prefix
                    continue
                entry = _Pending(event.stream, line, event.rank, now)
                self._queue.append(entry)
                self._open[entry.key] = entry
        self.tick(now)

    def add_line(self, rank: int, stream: str, text: str) -> None:
        """Queue a line of the launcher's own (e.g. a rank's failure) after what that rank printed before it."""
        now = time.monotonic()
        with self._lock:
            self._queue.append(_Pending(stream, text, rank, now, whole=True))
        self.tick(now)

    def tick(self, now: float | None = None) -> None:
        """Write the lines at the front that every rank printed, or that waited long enough."""
        now = time.monotonic() if now is None else now
        self._release(
            lambda e: e.whole or len(e.ranks) >= self.expected or now - e.since >= self.merge_window
        )

    def flush(self) -> None:
        """Write every waiting line now (before a failure is reported, and at the end)."""
        self._release(lambda e: True)

    def finish(self) -> None:
        """Write every waiting line, then one total per rank that dropped lines."""
        self.flush()
        notes = [
            f"{rank_label([r])} {plural(d.count, 'line')} of output dropped in all (too fast to show)"
            + (f"; the full log is {d.log_path}" if d.log_path else "")
            for r, d in sorted(self._dropped.items())
        ]
        self._write("stderr", notes)

    def _release(self, ready: Any) -> None:
        out: list[tuple[str, str]] = []
        with self._lock:
            while self._queue and ready(self._queue[0]):
                e = self._queue.popleft()
                if self._open.get(e.key) is e:
                    del self._open[e.key]
                out.append((e.stream, e.text if e.whole else f"{rank_label(e.ranks)} {e.text}"))
        i = 0
        while i < len(out):  # one write per run of lines on the same stream
            j = i
            while j < len(out) and out[j][0] == out[i][0]:
                j += 1
            self._write(out[i][0], [text for _, text in out[i:j]])
            i = j

    def _write(self, stream: str, lines: list[str]) -> None:
        if not lines:
            return
        if stream == "stderr":
            target = self._err_stream or self._stream or sys.stderr
        else:
            target = self._stream or sys.stdout
        try:
            target.write("".join(line + "\n" for line in lines))
            target.flush()
        except (ValueError, OSError):  # the cell's stream is closed: the rank's log file has it all
            pass
