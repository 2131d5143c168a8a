"""One XLA ordinal's side of a launch: run the user's payload under this ordinal and report to the host.

``torch_xla.launch`` calls :func:`ordinal_main` once per device, in a thread of a process it
started (one process per TPU chip; one process with a thread per device on XLA's CPU backend).
The first ordinal of a process connects that process to the host's relay socket
(:class:`accel_nb.launch.xla.launcher.Relay`) and installs, once:

- the event sink: events sent from an ordinal's thread carry that ordinal as their rank (a
  progress bar or ``log_metrics`` call need not know it);
- ``sys.stdout`` / ``sys.stderr`` routers: what an ordinal's thread prints goes out as that
  ordinal's output lines (and into its ``rank<N>.log``); output of other threads and of C code
  reaches the host's captured descriptors and shows as rank 0's.

Each ordinal then runs the payload on its own copy (unpickled per ordinal: threads of one
process must not share the model they move to their device) and sends its ``Result`` or
``Failure`` with the same worker code as CPU and GPU ranks.
"""

from __future__ import annotations

import faulthandler
import io
import os
import socket
import sys
import threading
from typing import Any

from ... import events
from ...xla import runtime as xla_runtime
from ..channel import ChannelClosed, EventWriter
from ..rank import tqdm_bridge
from ..rank.worker import RankSpec, WorkerRuntime, crash_path, die_with_parent, log_path

_local = threading.local()  # .ordinal: the ordinal this thread runs; .partial: {stream: unfinished line}
_process: _OrdinalProcess | None = None
_process_lock = threading.Lock()


def current_ordinal() -> int | None:
    """The ordinal the calling thread runs for, or None (not an ordinal thread)."""
    return getattr(_local, "ordinal", None)


class _OrdinalStream(io.TextIOBase):
    """Stands in for ``sys.stdout``/``sys.stderr`` in an ordinal process: whole lines of an ordinal's thread become its output."""

    def __init__(self, original: Any, name: str, process: _OrdinalProcess) -> None:
        self.original = original
        self.name = name
        self.process = process

    def write(self, text: str) -> int:
        ordinal = current_ordinal()
        if ordinal is None:
            return self.original.write(text)
        partial = _partial()
        data = partial.get(self.name, "") + text
        head, sep, tail = data.rpartition("\n")
        partial[self.name] = tail
        if sep:
            self.process.send_output(ordinal, self.name, head + "\n")
        return len(text)

    def flush(self) -> None:
        if current_ordinal() is None:
            self.original.flush()

    def fileno(self) -> int:
        return self.original.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.original, "encoding", "utf-8")


def _partial() -> dict[str, str]:
    partial = getattr(_local, "partial", None)
    if partial is None:
        partial = _local.partial = {}
    return partial


class _OrdinalProcess:
    """The per-process half: one connection to the host, the sink and the stream routers."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.in_host = os.getpid() == info.host_pid
        if not self.in_host:
            die_with_parent(info.host_pid)
            _renew_intraop_pool()
            # forked or spawned by torch_xla: a crash's stacks go where the host's go, also when the
            # process enabled faulthandler by itself (PYTHONFAULTHANDLER=1 writes them to stderr only)
            self._crash = open(crash_path(info.log_dir, 0), "a")  # noqa: SIM115 - lives as long as the process
            faulthandler.enable(file=self._crash, all_threads=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(info.relay_path)
        self.writer = EventWriter(sock.detach())
        self._logs: dict[int, Any] = {}
        self._logs_lock = threading.Lock()
        events.set_event_sink(self.send)
        tqdm_bridge.install()
        sys.stdout = _OrdinalStream(sys.stdout, "stdout", self)
        sys.stderr = _OrdinalStream(sys.stderr, "stderr", self)

    def send(self, event: events.Event) -> None:
        ordinal = current_ordinal()
        if ordinal is not None and event.rank != ordinal:
            event.rank = ordinal
        try:
            self.writer.send(event)
        except ChannelClosed:
            pass

    def send_output(self, ordinal: int, stream: str, text: str) -> None:
        self.send(events.Log(rank=ordinal, stream=stream, text=text))
        with self._logs_lock:
            log = self._logs.get(ordinal)
            if log is None:
                log = self._logs[ordinal] = open(log_path(self.info.log_dir, ordinal), "ab", buffering=0)  # noqa: SIM115
            log.write(text.encode("utf-8", "replace"))


def _renew_intraop_pool() -> None:
    """In a process torch_xla forked from the host: let one thread rebuild torch's intra-op thread pool.

    The host set torch's thread count before forking, so the child inherits a pool marked
    "rebuild after fork". Every device thread's first parallel operation would rebuild it, and
    two threads doing that at once can see no pool at all ("Invalid thread pool!", seen in CI).
    Called once, under the process lock, before any ordinal runs the user's code.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(torch.get_num_threads())


def _process_side(info: Any) -> _OrdinalProcess:
    global _process
    with _process_lock:
        if _process is None or _process.info != info:
            _process = _OrdinalProcess(info)
        return _process


class _FlushThreadOutput:
    """The ``capture`` of an ordinal's runtime: ``sync()`` sends the thread's unfinished line before its result."""

    def __init__(self, process: _OrdinalProcess) -> None:
        self.process = process

    def sync(self) -> None:
        ordinal = current_ordinal()
        partial = _partial()
        for stream, text in list(partial.items()):
            if text and ordinal is not None:
                self.process.send_output(ordinal, stream, text)
            partial[stream] = ""


def _world_size_problem(info: Any) -> str | None:
    import torch_xla.runtime as xr

    actual = int(xr.world_size())
    if actual == info.world_size:
        return None
    return (
        f"torch_xla runs {actual} devices but accel_nb counted {info.world_size} from {info.why}; "
        "the per-device results cannot be matched: please report this with the output of `accel-nb env`"
    )


def ordinal_main(ordinal: int, blob: bytes, info: Any) -> None:
    """torch_xla's entry for each device: run the payload as rank ``ordinal``; the result travels as an event.

    Never raises for the user's errors (they are reported as a ``Failure``), so torch_xla returns
    normally once every ordinal has reported.
    """
    import cloudpickle

    xla_runtime.fresh_thread_state()  # the pool may run this on a thread another device's function used
    process = _process_side(info)
    rank = ordinal if ordinal < info.world_size else 0
    _local.ordinal = rank
    spec = RankSpec(rank, info.world_size, info.log_dir, process.writer.fd, info.host_pid, False)
    runtime = WorkerRuntime(spec)
    runtime.writer = process.writer  # one writer (one lock) for every ordinal of this process
    runtime.capture = _FlushThreadOutput(process)
    try:
        runtime.send(events.Phase(rank=rank, phase="started"))
        problem = _world_size_problem(info)
        if problem:
            raise RuntimeError(problem)
        # this ordinal's own copy of the function, its arguments, the cell's namespace
        payload = cloudpickle.loads(blob)
    except BaseException as exc:  # noqa: BLE001
        runtime.report_failure(exc)
        return
    runtime.execute(payload)
    runtime.capture.sync()
