"""pdb in a rank, typed at from the launching process: ``breakpoint()``, ``pdb.set_trace()``, post-mortem.

A rank has no keyboard. ``install`` (called by the worker once its event channel is up) points
``sys.breakpointhook`` and ``pdb.set_trace`` at :class:`RankPdb`, a ``pdb.Pdb`` whose screen and
keyboard are the launching process: what pdb writes goes with each prompt as a ``DebugPrompt`` event
on the rank's event channel; the line a person types comes back over a Unix socket this rank
listens on (the launching process connects as soon as it reads the prompt, then sends the line).

- ``PYTHONBREAKPOINT=0`` makes ``breakpoint()`` do nothing, as in plain Python; another hook it names
  is called as Python would.
- A launching process that cannot ask anyone (no stdin in its front-end) answers ``SKIP_BREAKPOINT``: the rank
  continues and the launching process says the breakpoint was skipped. One that does not read the
  prompt at all (no accel_nb supervisor is reading) is waited for ``ACK_WAIT_S``, then the rank says
  so on its stderr and continues: a breakpoint never blocks a rank silently.
- ``c`` (or ``q``) tells the launching process the rank is released; ``n``/``s`` that it steps.

In a session the exception of the last failed command is kept (``keep_for_post_mortem``) until the
next cell; ``post_mortem`` opens pdb at its frame (``%accelerate debug``).

    install(rank=1, log_dir="/tmp/accel_nb-launch-x")   # in the rank, by the worker
"""

from __future__ import annotations

import contextlib
import os
import pdb
import socket
import sys
from typing import Any

from ... import events

ACK_WAIT_S = 30.0  # how long a prompt waits for the launching process to take it before it is skipped
_LAUNCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # accel_nb/launch
_MAX_UNIX_PATH = 100  # sockaddr_un holds 108 bytes on Linux


class _Where:
    """This rank's number and its listening socket (made at its first prompt)."""

    rank = 0
    log_dir = ""
    listener: socket.socket | None = None
    address = ""
    kept: BaseException | None = None  # a session's last failed command (post-mortem)


def install(rank: int, log_dir: str) -> None:
    """Route ``breakpoint()`` and ``pdb.set_trace()`` of this rank to the launching process."""
    _Where.rank, _Where.log_dir = rank, log_dir
    sys.breakpointhook = breakpointhook
    pdb.set_trace = set_trace


def breakpointhook(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` of a rank: ``PYTHONBREAKPOINT`` as Python reads it, else :class:`RankPdb`."""
    chosen = os.environ.get("PYTHONBREAKPOINT", "")
    if chosen == "0":
        return None
    if (chosen and chosen != "pdb.set_trace") or not events.in_launch():
        return sys.__breakpointhook__(*args, **kwargs)
    RankPdb().set_trace(sys._getframe(1))
    return None


def set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` in a rank: stop here, in the launching process's pdb prompt."""
    if not events.in_launch():
        debugger: pdb.Pdb = pdb.Pdb()
    else:
        debugger = RankPdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe(1))


def _listener() -> socket.socket:
    if _Where.listener is None:
        path = os.path.join(_Where.log_dir, f"rank{_Where.rank}.pdb.sock")
        if len(path.encode()) > _MAX_UNIX_PATH or not _Where.log_dir:
            path = f"\0accel_nb-pdb-{os.getpid()}"  # Linux's abstract namespace: no file, no length issue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(OSError):
            os.unlink(path)
        sock.bind(path)
        sock.listen(1)
        _Where.listener, _Where.address = sock, path
    return _Where.listener


def ask_launcher(output: str, prompt: str, where: str) -> str | None:
    """Send pdb's ``output`` and ``prompt``; the line typed in the launching process (None: nobody can answer)."""
    listener = _listener()
    events.emit(
        events.DebugPrompt(
            rank=_Where.rank, output=output, prompt=prompt, address=_Where.address, where=where
        )
    )
    listener.settimeout(ACK_WAIT_S)
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        print(
            f"[accel_nb] rank {_Where.rank}: breakpoint at {where} skipped: the launching process did not take "
            f"the prompt within {ACK_WAIT_S:.0f} s (no debugger front-end is reading)",
            file=sys.stderr,
            flush=True,
        )
        return None
    with conn:
        conn.settimeout(None)
        data = bytearray()
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:  # the launching process gave up (an interrupt, the launch ending): leave pdb
                return "q"
            data += chunk
    return data[:-1].decode("utf-8", "replace")


class _Screen:
    """pdb's stdout: kept until the next prompt, which carries it to the launching process."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        return None

    def take(self) -> str:
        text = "".join(self.parts)
        self.parts.clear()
        return text


class _Keyboard:
    """pdb's stdin: each line is asked of the launching process."""

    def __init__(self, debugger: RankPdb) -> None:
        self.debugger = debugger

    def readline(self) -> str:
        return self.debugger.ask()


class RankPdb(pdb.Pdb):
    """pdb whose prompts are answered in the launching process (``"(rank 1 Pdb) "``)."""

    def __init__(self) -> None:
        self.screen = _Screen()
        super().__init__(stdin=_Keyboard(self), stdout=self.screen, nosigint=True, readrc=False)
        self.use_rawinput = False
        self.prompt = f"(rank {_Where.rank} Pdb) "
        self.released = False

    def ask(self) -> str:
        text = self.screen.take()
        output = text[: -len(self.prompt)] if text.endswith(self.prompt) else text
        frame = getattr(self, "curframe", None)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        try:
            line = ask_launcher(output, self.prompt, where)
        except (
            KeyboardInterrupt
        ):  # the launch is being stopped: leave pdb (pdb would only say --KeyboardInterrupt--)
            line = "q"
        if line is None or line == events.SKIP_BREAKPOINT:
            return "c\n"
        return line + "\n"

    def set_continue(self) -> None:
        self.released = True
        super().set_continue()

    def set_quit(self) -> None:
        self.released = True
        super().set_quit()

    def interaction(self, frame: Any, traceback: Any) -> None:
        self.released = False
        try:
            super().interaction(frame, traceback)
        finally:
            state = "released" if self.released else "stepping"
            events.emit(events.DebugState(rank=_Where.rank, state=state))


# -- post-mortem (sessions) ---------------------------------------------------------------------
def keep_for_post_mortem(exc: BaseException | None) -> None:
    """Keep the exception a session cell failed with (its frames too) for ``%accelerate debug``; None: the cell
    succeeded, the last failure's frames are let go."""
    _Where.kept = exc


def _user_traceback(exc: BaseException) -> Any:
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_LAUNCH_DIR):
        tb = tb.tb_next
    return tb or exc.__traceback__


def post_mortem(rank: int) -> str:
    """Open pdb at the frame where this rank's last failed command raised; what it raised, in one line."""
    exc = _Where.kept
    if exc is None:
        raise RuntimeError(
            f"rank {rank} has no failed cell to debug: %accelerate debug opens the exception of the last cell "
            "that failed, until the next cell runs"
        )
    debugger = RankPdb()
    debugger.reset()
    debugger.message(f"{type(exc).__name__}: {exc}")
    debugger.interaction(None, _user_traceback(exc))
    return f"{type(exc).__name__}: {exc}"
