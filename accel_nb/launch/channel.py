"""The event channel: a rank writes pickled events into a pipe, the parent reads them back.

Each frame is an 8-byte length followed by a pickle. The writer is thread-safe (the user's
code, the output readers and the heartbeat all send), the reader never blocks.

    writer = EventWriter(fd)            # in the rank
    writer.send(Log(rank=0, stream="stdout", text="hi\\n"))
    reader = EventReader(fd, rank=0)    # in the parent
    events = reader.read_available()
"""

from __future__ import annotations

import errno
import os
import pickle
import struct
import threading

from ..events import Event, Failure

HEADER = struct.Struct("!Q")  # a frame: its length (8 bytes, big-endian), then the pickled event


def encode_event(event: Event) -> bytes:
    """Pickle an event (cloudpickle when plain pickle cannot: notebook classes in results)."""
    try:
        data = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001
        import cloudpickle

        data = cloudpickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


class ChannelClosed(OSError):
    """The parent is gone (its end of the pipe is closed)."""


class EventWriter:
    """The rank's end: ``send(event)`` from any thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        self.closed = False

    def send(self, event: Event) -> None:
        self.send_frame(encode_event(event))

    def send_frame(self, frame: bytes) -> None:
        """Send an already encoded event (see ``encode_event``)."""
        with self._lock:
            if self.closed:
                return
            view = memoryview(frame)
            try:
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except BrokenPipeError:
                self.closed = True
                raise ChannelClosed("the launching process is gone") from None

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                try:
                    os.close(self.fd)
                except OSError:
                    pass


class EventReader:
    """The parent's end for one rank: non-blocking, returns whole events as they arrive."""

    def __init__(self, fd: int, rank: int) -> None:
        self.fd = fd
        self.rank = rank
        self.eof = False
        self._buf = bytearray()
        os.set_blocking(fd, False)

    def read_available(self, max_bytes: int = 1 << 22) -> list[Event]:
        """Read what is in the pipe now (up to ``max_bytes``) and decode the complete frames."""
        got = 0
        while not self.eof and got < max_bytes:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            got += len(chunk)
            self._buf += chunk
        return self._decode()

    def _decode(self) -> list[Event]:
        events: list[Event] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= HEADER.size:
            (size,) = HEADER.unpack_from(buf, pos)
            end = pos + HEADER.size + size
            if len(buf) < end:
                break
            data = bytes(buf[pos + HEADER.size : end])
            pos = end
            events.append(self._load(data))
        del buf[:pos]
        return events

    def _load(self, data: bytes) -> Event:
        try:
            return pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 - e.g. a result whose class the notebook cannot import
            return Failure(
                rank=self.rank,
                exc_type=type(exc).__name__,
                message=f"what rank {self.rank} sent could not be unpickled in the notebook: {exc}",
                traceback="",
            )

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
            self.eof = True
