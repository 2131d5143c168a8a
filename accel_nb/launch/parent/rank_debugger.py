"""The launching process's side of a rank's pdb: one prompt at a time, asked with ``input()``.

A rank at a ``breakpoint()`` sends a ``DebugPrompt`` (``accel_nb.launch.rank.debugger``). The
supervisor hands it to a :class:`DebugDesk`, which at once connects to the rank's socket (the rank
waits for that, and skips the breakpoint when nobody takes it), then, from the supervisor's loop,
shows what pdb wrote and asks the line with ``input()``: in Jupyter the kernel's input box (stdin
``input_request``), in a terminal the terminal. While the person types, a thread keeps reading the
other ranks' channels (they run on until they need the rank being debugged) and hands their events
to the supervisor, and redraws its view (the rows say who waits for the debugger): the supervisor's
own thread is parked in ``input()`` meanwhile, so its state and its reporter have one user at a time.

- One rank at a time: the rank being debugged keeps the prompt until it is released (``c``, ``q``)
  or ends; then the lowest rank waiting at a breakpoint gets it. ``rank N`` typed at a prompt (not
  Python: pdb would call it a syntax error) moves the prompt to rank N if it waits at a breakpoint;
  the rank left keeps its place at its prompt. A rank whose step (``n`` over an ``all_reduce``) does
  not stop again within ``STEP_GRACE_S`` while another rank waits at a breakpoint passes the prompt
  on: its step may be waiting for that rank.
- A front-end that sends no input (``allow_stdin`` off, a terminal that is not one) cannot answer:
  the breakpoint is skipped and said in the rank's output.
- The hang watchdog does not count the time a rank spends in the debugger (``active``).

    desk = DebugDesk(procs, report)
    desk.take(event)                    # from any thread: True when it was the debugger's event
    desk.serve(handle, tick)            # in the supervisor's loop: asks one line if a prompt is due
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ...events import SKIP_BREAKPOINT, DebugPrompt, DebugState, Event, Log, Phase

_SWITCH = re.compile(r"rank\s+(\d+)")  # typed at a prompt: move the prompt to that rank
# a rank that steps (n, s, r) and has not stopped again after this long while another rank waits at a
# breakpoint gives that rank the prompt: its step may wait in a collective for that very rank
STEP_GRACE_S = 1.0
CONNECT_WAIT_S = 10.0  # the rank listens before it sends its prompt: connecting is immediate
IN_DEBUGGER = "in the debugger"  # the row of the rank being debugged; the others': "waiting for rank 1 (in the debugger)"
AT_BREAKPOINT = "at a breakpoint"  # the row of a rank whose prompt waits for its turn


def debugger_phase(phase: str) -> bool:
    """A row's phase that the debugger set: such a rank is not quiet or stalled, it waits for a person."""
    return IN_DEBUGGER in phase or phase.startswith(AT_BREAKPOINT)


def _kernel() -> Any:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None)


def stdin_answerable() -> bool:
    """Whether ``input()`` here reaches a person: the kernel's front-end allows stdin, or stdin is a terminal."""
    kernel = _kernel()
    if kernel is not None:
        return bool(getattr(kernel, "_allow_stdin", False))
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _connect(address: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_WAIT_S)
    try:
        sock.connect(address)
    except OSError:  # the rank gave up waiting, or is gone
        sock.close()
        return None
    return sock


def _answer(conn: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError), conn:
        conn.sendall(line.replace("\n", " ").encode() + b"\n")


REDRAW_S = 0.25  # while the person types, the view is redrawn this often


class _Reading:
    """While the person types: a thread reads the ranks' channels into ``handle`` and calls ``tick`` now and then.

    It runs in the launching cell's context (a copy): what the view prints lands in that cell.
    """

    def __init__(self, desk: DebugDesk, handle: Callable[[Event], None], tick: Callable[[], None]) -> None:
        self.desk, self.handle, self.tick = desk, handle, tick
        self._stop = threading.Event()
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run,), name="accel_nb-debug-reader", daemon=True
        )

    def __enter__(self) -> _Reading:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for proc in self.desk.procs:
                if not proc.reader.eof:
                    sel.register(proc.reader.fd, selectors.EVENT_READ, proc)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=REDRAW_S) if sel.get_map() else []:
                    proc = key.data
                    for event in proc.reader.read_available():
                        self.handle(event)
                    if proc.reader.eof:
                        sel.unregister(key.fd)
                if not sel.get_map():
                    self._stop.wait(REDRAW_S)
                self.tick()
        finally:
            sel.close()


class DebugDesk:
    """Prompts of ranks at a breakpoint, answered one at a time by the person at the launching process."""

    def __init__(self, procs: list[Any], report: Callable[[Event], None]) -> None:
        self.procs = procs
        self.report = report
        self.waiting: dict[int, tuple[DebugPrompt, socket.socket]] = {}  # at a prompt, taken (connected)
        self.current: int | None = None  # the rank whose pdb the person is in
        self.over: set[int] = set()  # ranks that ended (or answered their command)
        self.skipped: set[int] = set()  # ranks told once that their breakpoints are skipped
        self._marked: set[int] = set()  # ranks whose row says they wait for the rank being debugged
        self._announced: int | None = None  # the rank whose prompt was last announced
        self._stepping_since: float | None = None  # when the rank being debugged last ran a step
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """A rank is in the debugger or waits at a breakpoint (the hang watchdog does not count this time)."""
        return bool(self.waiting) or self.current is not None

    def take(self, event: Event) -> bool:
        """Fold in a debugger event (any thread); False for every other event."""
        if isinstance(event, DebugPrompt):
            conn = _connect(event.address)  # the rank waits for this before it waits for the line
            if conn is not None:
                with self._lock:
                    self.waiting[event.rank] = (event, conn)
                    if event.rank == self.current:
                        self._stepping_since = None
            return True
        if isinstance(event, DebugState):
            with self._lock:
                if self.current == event.rank:
                    if event.state == "released":
                        self._release()
                    else:
                        self._stepping_since = time.monotonic()
            return True
        return False

    def rank_over(self, rank: int) -> None:
        """``rank`` ended or answered its command: it is at no prompt any more."""
        with self._lock:
            self.over.add(rank)
            taken = self.waiting.pop(rank, None)
            if self.current == rank:
                self._release()
        if taken is not None:
            with contextlib.suppress(OSError):
                taken[1].close()

    def close(self) -> None:
        """The supervisor is done: a rank still at a prompt reads the end of its connection and leaves pdb."""
        with self._lock:
            waiting, self.waiting = list(self.waiting.values()), {}
        for _, conn in waiting:
            with contextlib.suppress(OSError):
                conn.close()

    def _release(self) -> None:
        rank, self.current, self._announced, self._stepping_since = self.current, None, None, None
        for other in sorted(self._marked | {rank}):
            if other not in self.over:
                self.report(Phase(rank=other, phase="running"))
        self._marked.clear()

    def _next(self) -> int | None:
        with self._lock:
            if self.current is None:
                return min(self.waiting) if self.waiting else None
            if self.current in self.waiting:  # stays with the person until it is released
                return self.current
            since = self._stepping_since
            if since is None or not self.waiting or time.monotonic() - since < STEP_GRACE_S:
                return None
            stepping, self.current, self._stepping_since = self.current, min(self.waiting), None
        sys.stdout.write(
            f"[accel_nb] rank {stepping} is still in its step (waiting for another rank?); "
            f"the prompt goes to rank {self.current}, and back to rank {stepping} when it stops\n"
        )
        return self.current

    def serve(self, handle: Callable[[Event], None], tick: Callable[[], None]) -> None:
        """If a prompt is due, show it and send the person's line; meanwhile the ranks' events go to ``handle``."""
        rank = self._next()
        if rank is None:
            return
        with self._lock:
            event, conn = self.waiting.pop(rank)
        if not stdin_answerable():
            self._skip(event, conn)
            return
        if self._announced != rank:
            self.current = self._announced = rank
            self._announce(event)
        if event.output:
            sys.stdout.write(event.output if event.output.endswith("\n") else event.output + "\n")
        tick()  # the rows say who is in the debugger, before the prompt shows
        try:
            with _Reading(self, handle, tick):
                line = input(event.prompt)
        except EOFError:  # end of input (Ctrl-D): the rank continues
            line = "c"
        except BaseException:  # an interrupt: the rank reads the end of its connection and leaves pdb
            conn.close()
            raise
        switch = _SWITCH.fullmatch(line.strip())
        if switch is not None:
            self._switch(int(switch.group(1)), event, conn)
            return
        _answer(conn, line)

    def _switch(self, target: int, event: DebugPrompt, conn: socket.socket) -> None:
        """``rank N`` typed at ``event``'s prompt: the prompt moves to rank N if it waits at a breakpoint."""
        held = dataclasses.replace(event, output="")  # asked again later, without pdb's lines shown twice
        with self._lock:
            self.waiting[event.rank] = (held, conn)  # the rank still waits for its line
            others = sorted(r for r in self.waiting if r != event.rank)
            if target in others:
                self.current = target
        if self.current == target:
            return
        said = (
            f"ranks at a breakpoint: {', '.join(map(str, others))}" if others else "no other rank is at one"
        )
        sys.stdout.write(
            f"[accel_nb] rank {target} is not waiting at a breakpoint ({said}); still rank {event.rank}\n"
        )

    def _announce(self, event: DebugPrompt) -> None:
        rank = event.rank
        where = f" at {event.where}" if event.where else ""
        others = [p.rank for p in self.procs if p.rank != rank and p.rank not in self.over]
        said = ""
        if others:
            who = f"rank {others[0]} runs" if len(others) == 1 else f"ranks {', '.join(map(str, others))} run"
            said = f"; {who} on until {'it needs' if len(others) == 1 else 'they need'} rank {rank}"
        switch = " 'rank N' moves the prompt to another rank at a breakpoint." if others else ""
        sys.stdout.write(f"[accel_nb] rank {rank} stopped in pdb{where}{said}. 'c' lets it go on.{switch}\n")
        sys.stdout.flush()
        self.report(Phase(rank=rank, phase=IN_DEBUGGER))
        for other in others:
            if other in self.waiting:
                self.report(Phase(rank=other, phase=f"{AT_BREAKPOINT}, after rank {rank}"))
            else:
                self.report(Phase(rank=other, phase=f"waiting for rank {rank} ({IN_DEBUGGER})"))
            self._marked.add(other)

    def _skip(self, event: DebugPrompt, conn: socket.socket) -> None:
        _answer(conn, SKIP_BREAKPOINT)
        if event.rank in self.skipped:
            return
        self.skipped.add(event.rank)
        where = f" at {event.where}" if event.where else ""
        why = (
            "this front-end sends no input to the kernel (stdin is off)"
            if _kernel() is not None
            else "stdin is not a terminal"
        )
        self.report(
            Log(
                rank=event.rank,
                stream="stderr",
                text=f"[accel_nb] rank {event.rank}: breakpoint{where} skipped: {why}, so nobody can answer pdb; "
                "later breakpoints of this rank are skipped too\n",
            )
        )
