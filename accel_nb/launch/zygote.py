"""The spawn server (zygote): one clean interpreter with torch imported that forks spawned ranks on request.

Spawning a rank normally costs a fresh interpreter plus ``import torch`` (seconds). The server is
started once, by the first spawn launch of a session, from a fresh interpreter: it never touches
CUDA, so forking it is as safe as a spawn, and every later spawn launch starts in a fraction of a
second. Once its first ranks run, it imports in the background what each rank's first DDP step
would import (see ``warm``), so later ranks inherit it. It dies with the notebook (parent-death
signal) and is restarted when needed. Set
``ACCEL_NB_SPAWN_SERVER=0`` to start every rank as a fresh interpreter instead.

    server = get_server()                       # started (and warmed) on first use
    pid = server.start_rank(spec_file, rank, env, event_fd, log_fd)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from . import kernel_debugger
from .pythonpath import with_package_on_path

ENV_SWITCH = "ACCEL_NB_SPAWN_SERVER"
READY_TIMEOUT_S = 120.0
_MAX_MSG = 1 << 20

_server: SpawnServer | None = None
_server_lock = threading.Lock()


def enabled() -> bool:
    """On unless ``ACCEL_NB_SPAWN_SERVER=0``; Linux only (fork + fd passing; macOS forks are not safe)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


class SpawnServerError(RuntimeError):
    """The spawn server could not be started or stopped answering."""


class SpawnServer:
    """The notebook's handle on the server process: start ranks, learn when they exit."""

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = with_package_on_path(dict(os.environ))
        code = "from accel_nb.launch.zygote import serve; serve()"
        try:
            with kernel_debugger.unpatched_subprocesses():  # a clean interpreter, not one under debugpy
                self.popen = subprocess.Popen(
                    [sys.executable, "-c", code, str(child.fileno()), str(os.getpid())],
                    pass_fds=(child.fileno(),),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
        finally:
            child.close()
        self.sock = parent
        self.exits: dict[int, int] = {}
        self.dead = False
        self._lock = threading.Lock()
        msg = self._recv(timeout=READY_TIMEOUT_S)
        if msg is None or msg[0] != "ready":
            err = b""
            # already gone / stuck: the error says so
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.popen.kill()
                err = self.popen.communicate(timeout=5)[1] or b""
            self.close()
            raise SpawnServerError(f"the spawn server did not start: {err.decode(errors='replace')[-2000:]}")
        self.pid = self.popen.pid
        # stderr stays a pipe nobody reads: the server itself prints nothing after "ready"

    # -- messages -----------------------------------------------------------------------------
    def _recv(self, timeout: float | None) -> tuple | None:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        data = self.sock.recv(_MAX_MSG)
        if not data:
            self._mark_dead()
            return None
        return pickle.loads(data)

    def _mark_dead(self) -> None:
        self.dead = True

    def pump(self) -> None:
        """Read exit notices that arrived (non-blocking)."""
        with self._lock:
            while not self.dead:
                msg = self._recv(0)
                if msg is None:
                    break
                if msg[0] == "exit":
                    self.exits[msg[1]] = msg[2]
            if self.dead or self.popen.poll() is not None:
                self.dead = True

    def returncode(self, pid: int) -> int | None:
        self.pump()
        if pid in self.exits:
            return self.exits.pop(pid)
        if self.dead:  # its children die with it (SIGKILL through the parent-death signal)
            return -signal.SIGKILL
        return None

    def start_rank(
        self, spec_file: str, rank: int, env: dict[str, str], event_fd: int, log_fd: int, last: bool = True
    ) -> int:
        """Fork a rank in the server; returns its pid (the rank is in its own process group).

        ``last`` says no more ranks of this launch follow: only then may the server start its
        background pre-import (a fork waits for it, so pre-importing between two ranks would hold back the rest).
        """
        request = pickle.dumps({"spec_file": spec_file, "rank": rank, "env": env, "last": last})
        with self._lock:
            socket.send_fds(self.sock, [request], [event_fd, log_fd])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = self._recv(max(0.0, deadline - time.monotonic()))
                if msg is None:
                    if self.dead:
                        break
                    continue
                if msg[0] == "exit":
                    self.exits[msg[1]] = msg[2]
                elif msg[0] == "started" and msg[1] == rank:
                    return int(msg[2])
        self.dead = True
        raise SpawnServerError("the spawn server stopped answering")

    def close(self) -> None:
        """Teardown: close the socket, kill the server's group, reap it (each step whatever the last did)."""
        self.dead = True
        self.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.kill()  # a no-op when it was reaped
        with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (D state): left to init
            self.popen.wait(timeout=5)
        if self.popen.stderr is not None:
            self.popen.stderr.close()


def get_server() -> SpawnServer:
    """The running server, started (or restarted) when needed."""
    global _server
    with _server_lock:
        if _server is None or _server.dead or _server.popen.poll() is not None:
            if _server is not None:
                _server.close()
            _server = SpawnServer()
        return _server


def shutdown() -> None:
    """Stop the server (the next spawn launch starts a new one)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


def _shutdown_at_exit() -> None:
    with contextlib.suppress(Exception):  # interpreter teardown: modules may be half gone; never raise here
        shutdown()


import atexit  # noqa: E402

atexit.register(_shutdown_at_exit)


# ---------------------------------------------------------------------------- the server side
def serve(argv: list[str] | None = None) -> None:
    """Server main: import torch, then fork a rank per request and report exits."""
    argv = sys.argv[1:] if argv is None else argv
    fd, parent_pid = int(argv[0]), int(argv[1])
    from . import preimport
    from .rank.worker import die_with_parent

    die_with_parent(parent_pid)
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook decides when ranks stop
    import cloudpickle  # noqa: F401 - warm: every rank needs these
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import accel_nb.state  # noqa: F401

    from .rank import worker  # noqa: F401

    sock.send(pickle.dumps(("ready", os.getpid())))
    children: set[int] = set()
    launch_started = False  # every rank of a launch is forked: pre-importing can no longer hold one back
    while True:
        ready, _, _ = select.select([sock], [], [], 0.02)
        # the first ranks run: import what their first DDP step imports, once, for later ranks
        if launch_started:
            preimport.start()
        if ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                break  # the notebook is gone
            request = pickle.loads(data)
            preimport.wait()  # never fork while the pre-import thread holds an import lock
            pid = os.fork()
            if pid == 0:
                _rank_child(sock, request, fds)  # never returns
            for f in fds:
                os.close(f)
            children.add(pid)
            launch_started = launch_started or request.get("last", True)
            sock.send(pickle.dumps(("started", request["rank"], pid)))
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            with contextlib.suppress(OSError):
                sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os._exit(0)


def _rank_child(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    code = 70
    try:
        event_fd, log_fd = fds
        sock.close()
        os.setpgid(0, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        from .rank.worker import spawn_main

        spawn_main([request["spec_file"], str(request["rank"]), str(event_fd), str(os.getppid())])
    finally:
        os._exit(code)
