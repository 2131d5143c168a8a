"""Capture a rank's output at the file-descriptor level and turn it into ``Log`` events.

fds 1 and 2 are pointed at pipes, so output from Python, C libraries (gloo, NCCL) and child
processes is caught alike. Reader threads send whole lines and keep every byte in the rank's log
file. Past a rate limit (``HEAD_LINES`` at once, ``LINES_PER_SECOND`` after) a flood begins: no line
is sent until the rank pauses or its payload ends, then its last ``TAIL_LINES`` lines are, after a
``Dropped`` event that counts the lines never sent (sent at most once a second while the flood lasts
too). The reporters show a bounded head, one note per rank and the flood's final lines.

    capture = OutputCapture(rank=0, send=writer.send, log_path="/tmp/x/rank0.log")
    capture.start(); ...; capture.stop()
"""

from __future__ import annotations

import codecs
import io
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...events import Dropped, Event, Log

PARTIAL_FLUSH_S = 0.5  # a line without its newline is sent after this long
DROPPED_NOTE_S = 1.0  # while lines are dropped, the running count is sent at most this often
HEAD_LINES = 500  # lines a rank may print at once before its output counts as a flood
LINES_PER_SECOND = 200.0  # ... and then per second, on average
TAIL_LINES = 20  # the last lines of a flood, always shown (when the output pauses or the payload ends)
FLOOD_QUIET_S = 0.5  # a flood is over when the rank has written nothing for this long


class _RateLimit:
    """Token bucket shared by a rank's streams: ``burst`` lines at once, then ``per_second``.

    The first line over the limit starts a flood: from then on nothing is sent, the last ``tail``
    lines are held, until the output pauses (or the payload ends); :meth:`end_flood` hands them over.
    So a flood leaves a bounded head (what the bucket allowed) and its final lines, never a sample.
    """

    def __init__(self, per_second: float, burst: float, tail: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self.tokens = burst
        self.last = time.monotonic()
        self.dropped = 0  # lines never sent so far (never reset: the count shown is a running total)
        self.flooding = False
        self.held: deque[tuple[str, str]] = deque(maxlen=max(int(tail), 0))  # (stream, line): a flood's tail
        self.last_input = self.last  # when the rank last wrote anything (a flood ends when it pauses)
        self.lock = threading.Lock()

    def take(self, stream: str, lines: list[str]) -> list[str]:
        """The lines to send now; in a flood none (the newest are held, the older ones dropped)."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.per_second)
            self.last = now
            ok = 0 if self.flooding else min(len(lines), int(self.tokens))
            self.tokens -= ok
            over = lines[ok:]
            if over:
                self.flooding = True
                keep = over[-self.held.maxlen :] if self.held.maxlen else []
                self.dropped += (
                    max(0, len(self.held) + len(keep) - (self.held.maxlen or 0)) + len(over) - len(keep)
                )
                self.held.extend((stream, line) for line in keep)
            return lines[:ok]

    def end_flood(self, quiet_s: float | None = None) -> list[tuple[str, str]] | None:
        """End a flood (only if the rank wrote nothing for ``quiet_s`` seconds, when given): its held tail."""
        with self.lock:
            if not self.flooding or (quiet_s is not None and time.monotonic() - self.last_input < quiet_s):
                return None
            self.flooding = False
            held = list(self.held)
            self.held.clear()
            return held


class OutputCapture:
    """Point fds 1/2 at pipes; reader threads send ``Log`` events and append to ``log_path``."""

    def __init__(
        self,
        rank: int,
        send: Callable[[Event], None],
        log_path: str,
        lines_per_second: float = LINES_PER_SECOND,
        burst: float = HEAD_LINES,
        tail: int = TAIL_LINES,
    ) -> None:
        self.rank = rank
        self.send = send
        self.log_path = log_path
        self.limit = _RateLimit(lines_per_second, burst, tail)
        self._threads: list[threading.Thread] = []
        self._read_fds: list[int] = []
        self._busy = 0  # readers between a read and its events being sent
        self._log = open(log_path, "ab", buffering=0)
        self._log_lock = threading.Lock()
        self._dropped_sent = 0  # the running count last sent in a ``Dropped`` event
        self._dropped_sent_at = 0.0

    def start(self) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            self._read_fds.append(r)
            t = threading.Thread(target=self._pump, args=(r, name), name=f"accel_nb-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        # Python-level streams onto the captured fds (under fork they were the kernel's ZMQ streams)
        old = (sys.stdout, sys.stderr)
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
        _redirect_logging(old, (sys.stdout, sys.stderr))

    def sync(self, timeout: float = 1.0) -> None:
        """Flush Python's streams and wait until the readers have sent what is in the pipes."""
        _flush_python_streams()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._busy == 0 and all(_unread(fd) == 0 for fd in self._read_fds):
                break
            time.sleep(0.002)
        self._end_flood()  # the payload is over: a flood's last lines come before its result

    def stop(self, timeout: float = 2.0) -> None:
        """Flush, close the write ends (EOF for the readers), wait for them to send the rest."""
        _flush_python_streams()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._end_flood()
        self._note_dropped(final=True)
        try:
            self._log.close()
        except OSError:  # teardown: the disk is full or gone; the rank is ending anyway
            pass

    def _end_flood(self, quiet_s: float | None = None) -> None:
        """A flood is over: send its final count, then the lines held as its tail (in order)."""
        held = self.limit.end_flood(quiet_s)
        if held is None:
            return
        self._note_dropped(final=True, held=len(held))
        i = 0
        while i < len(held):  # one event per run of lines on the same stream
            j = i
            while j < len(held) and held[j][0] == held[i][0]:
                j += 1
            self._send(held[i][0], "".join(line for _, line in held[i:j]))
            i = j

    def _note_dropped(self, final: bool = False, held: int = 0) -> None:
        """Send the running count of dropped lines: at most every ``DROPPED_NOTE_S``, and at the end."""
        with self.limit.lock:
            count = self.limit.dropped
            now = time.monotonic()
            due = held > 0 or (
                count != self._dropped_sent and (final or now - self._dropped_sent_at >= DROPPED_NOTE_S)
            )
            if due:
                self._dropped_sent, self._dropped_sent_at = count, now
        if due:
            try:
                self.send(Dropped(rank=self.rank, count=count, log_path=self.log_path, held=held))
            except Exception:  # noqa: BLE001 - the channel is gone: nothing left to tell
                pass

    def _send(self, stream: str, text: str) -> None:
        try:
            self.send(Log(rank=self.rank, stream=stream, text=text))
        except Exception:  # noqa: BLE001 - a reader thread must outlive a failed send; the log file has the text
            pass

    def _emit_lines(self, stream: str, lines: list[str]) -> None:
        if not lines:
            return
        lines = self.limit.take(stream, lines)
        if self.limit.dropped != self._dropped_sent:  # a flood is on (or just ended): update its count
            self._note_dropped()
        if lines:
            self._send(stream, "".join(lines))

    def _pump(self, fd: int, stream: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        pending_since = 0.0
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], PARTIAL_FLUSH_S)
                if not ready:
                    if pending and time.monotonic() - pending_since >= PARTIAL_FLUSH_S:
                        self._emit_lines(stream, [pending.rsplit("\r", 1)[-1] + "\n"])
                        pending = ""
                    self._end_flood(FLOOD_QUIET_S)  # the rank paused: a flood's tail and final count
                    if self.limit.dropped != self._dropped_sent:
                        self._note_dropped()
                    continue
                self._busy += 1
                try:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    pending, pending_since = self._handle_chunk(
                        stream, chunk, decoder, pending, pending_since
                    )
                finally:
                    self._busy -= 1
            tail = pending + decoder.decode(b"", final=True)
            if tail:
                self._emit_lines(stream, [tail.rsplit("\r", 1)[-1] + "\n"])
        finally:
            os.close(fd)

    def _handle_chunk(
        self, stream: str, chunk: bytes, decoder: Any, pending: str, pending_since: float
    ) -> tuple[str, float]:
        self.limit.last_input = time.monotonic()
        with self._log_lock:
            try:
                self._log.write(chunk)
            except OSError:  # disk full: the lines still go to the notebook
                pass
        text = pending + decoder.decode(chunk)
        if not pending:
            pending_since = time.monotonic()
        parts = text.split("\n")
        pending = parts.pop()
        if len(pending) > 8192:  # a huge line without a newline: send it anyway
            parts.append(pending)
            pending = ""
        # a carriage-return progress bar keeps only its latest state per line
        self._emit_lines(stream, [p.rsplit("\r", 1)[-1] + "\n" for p in parts])
        if parts:
            pending_since = time.monotonic()
        return pending, pending_since


def _flush_python_streams() -> None:
    """Push what Python buffered for fds 1 and 2 into the pipes (a closed stream has nothing left)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (ValueError, OSError):
            pass


def _redirect_logging(old: tuple, new: tuple) -> None:
    """Logging handlers created in the notebook write to its (now dead) streams: point them at ours."""
    logging = sys.modules.get("logging")
    if logging is None:
        return
    # every handler made registers a weak reference in logging's _handlerList: a few handlers to look
    # at instead of every logger (~130 once torch is imported, ~1 ms of a forked rank's start)
    refs = getattr(logging, "_handlerList", None)
    if isinstance(refs, list):
        handlers = [h for h in (ref() for ref in list(refs)) if h is not None]
    else:  # a logging module without it: every logger's handlers
        loggers = [logging.getLogger()] + [
            lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
        ]
        handlers = [h for logger in loggers for h in list(getattr(logger, "handlers", []))]
    for handler in handlers:
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream is not None:
            for before, after in zip(old, new):
                if stream is before:
                    try:
                        handler.setStream(after)
                    except (ValueError, OSError):
                        pass  # flushing the dead stream failed: it is replaced anyway


def _unread(fd: int) -> int:
    """Bytes waiting in pipe ``fd`` (0 when it cannot be asked)."""
    try:
        import fcntl
        import termios

        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        return int.from_bytes(buf, sys.byteorder)
    except (ImportError, OSError):  # not a POSIX system / not a pipe: nothing known to wait for
        return 0
