"""The rank side of an interactive session: a loop that runs commands one after another in one namespace.

A session starts its ranks with a ``SessionLoop`` payload (through the launch kind's ``start`` and the same
worker entry as a one-shot launch). The loop connects back to the parent over a Unix socket,
then waits for commands. Each command (``RunCode``, ``RunFunction``, ``Push``, ``Pull``,
``FormGroup``) is a payload run by ``WorkerRuntime.execute``: its output, progress, result and
failure travel over the rank's event channel exactly as in a one-shot launch. A failing command
leaves the loop, the process and the namespace alive.

    loop = SessionLoop("/tmp/accel_nb-session-x/session.sock", token)   # what every rank runs
"""

from __future__ import annotations

import builtins
import contextlib
import os
import pickle
import socket
import struct
import time
from typing import Any

from ..payload import register_sources, split_last_expression

_HEADER = struct.Struct("!Q")
_LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")
REGROUP_LISTEN_WAIT_S = 30.0  # how long a rank waits for rank 0's new store before connecting anyway


# ------------------------------------------------------------------------------------- framing
def send_message(sock: socket.socket, message: Any) -> None:
    """Send one cloudpickled message (8-byte length first)."""
    import cloudpickle

    data = cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise EOFError("the session's parent closed the connection")
        chunks += chunk
    return bytes(chunks)


def recv_message(sock: socket.socket) -> Any:
    """Receive one message sent by ``send_message``; ``EOFError`` when the other side is gone."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, size))


# ------------------------------------------------------------------------------------- commands
def new_namespace() -> dict[str, Any]:
    """A rank's persistent namespace: what a fresh notebook starts with."""
    return {"__name__": "__main__", "__builtins__": builtins}


def bind_to_namespace(value: Any, namespace: dict[str, Any]) -> Any:
    """A function defined in the notebook (``__main__``) reads its globals from the rank's namespace, as a cell does."""
    import types

    if not (isinstance(value, types.FunctionType) and value.__module__ == "__main__"):
        return value
    fn = types.FunctionType(value.__code__, namespace, value.__name__, value.__defaults__, value.__closure__)
    fn.__kwdefaults__ = value.__kwdefaults__
    fn.__qualname__ = value.__qualname__
    fn.__dict__.update(value.__dict__)
    return fn


class SessionCommand:
    """A payload that runs in the rank's persistent namespace (set by the loop before it runs)."""

    kind = "session"
    namespace: dict[str, Any]
    # set by the session after a re-formed group: the answer says what still holds the old one
    check_stale = False

    def describe(self) -> str:
        return type(self).__name__

    def _with_stale(self, answer: dict[str, Any]) -> dict[str, Any]:
        if self.check_stale:
            from ...process_group import stale_group_holders

            answer["stale"] = stale_group_holders(self.namespace)
        return answer

    def unsendable(self, rank: int, value: Any, error: BaseException) -> str:
        return (
            f"rank {rank}'s value is a {type(value).__module__}.{type(value).__qualname__} that cannot be sent "
            f"back to the notebook ({type(error).__name__}: {error}); keep it on the workers or send plain data"
        )


class RunCode(SessionCommand):
    """Run a cell's source; show (``show_value``) and/or send back (``send_value``) its last expression.

    The value sent back is ``{"value": last expression or None, "names": {name: value}}``; ``names``
    holds ``return_names`` on rank ``return_rank``.
    """

    def __init__(
        self,
        source: str,
        filename: str = "<session-cell>",
        *,
        show_value: bool = True,
        send_value: bool = False,
        return_names: tuple[str, ...] = (),
        return_rank: int = 0,
    ) -> None:
        self.source = source
        self.return_rank = return_rank
        self.filename = filename
        self.show_value = show_value
        self.send_value = send_value
        self.return_names = tuple(return_names)
        split_last_expression(source, filename)  # a SyntaxError here, in the notebook

    def describe(self) -> str:
        return self.filename

    def run(self, rank: int) -> Any:
        register_sources({self.filename: self.source.splitlines(keepends=True)})
        ns = self.namespace
        body, last = split_last_expression(self.source, self.filename)
        exec(body, ns)
        value = eval(last, ns) if last is not None else None
        if value is not None and self.show_value:
            print(repr(value), flush=True)
        if rank != self.return_rank:
            return self._with_stale({"value": value if self.send_value else None, "names": {}})
        missing = [n for n in self.return_names if n not in ns]
        if missing:
            raise NameError(
                f"--return asked for {', '.join(missing)} but rank {rank}'s namespace has no such name"
            )
        return self._with_stale(
            {
                "value": value if self.send_value else None,
                "names": {n: ns[n] for n in self.return_names},
            }
        )


class RunFunction(SessionCommand):
    """Call ``function(*args, **kwargs)``; a function defined in the notebook reads the rank's namespace as its globals."""

    def __init__(self, function: Any, args: tuple = (), kwargs: dict | None = None) -> None:
        if not callable(function):
            raise TypeError(f"Session.run needs code (a string) or a function, got {type(function).__name__}")
        self.function = function
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})

    def describe(self) -> str:
        return getattr(self.function, "__qualname__", None) or repr(self.function)

    def run(self, rank: int) -> Any:
        fn = bind_to_namespace(self.function, self.namespace)
        return self._with_stale({"value": fn(*self.args, **self.kwargs), "names": {}})


class Push(SessionCommand):
    """Put ``values`` into the rank's namespace."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = dict(values)

    def describe(self) -> str:
        return "push " + ", ".join(self.values)

    def run(self, rank: int) -> Any:
        self.namespace.update({k: bind_to_namespace(v, self.namespace) for k, v in self.values.items()})
        return {"value": None, "names": {}}


class Pull(SessionCommand):
    """Send back the rank's ``name`` (tensors and modules moved to the CPU by the worker)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> str:
        return f"pull {self.name}"

    def run(self, rank: int) -> Any:
        if self.name not in self.namespace:
            raise NameError(
                f"rank {rank} has no variable {self.name!r}; define it in a cell or push it first"
            )
        return {"value": self.namespace[self.name], "names": {}}


class FormGroup(SessionCommand):
    """Join the launch's process group (``PartialState``: gloo on CPU, nccl on GPUs); reports the device."""

    def describe(self) -> str:
        return "session start"

    def run(self, rank: int) -> Any:
        from ...state import PartialState

        state = PartialState()
        return {"value": {"device": str(state.device), "pid": os.getpid()}, "names": {}}


def _socket_inodes(pid: int | str) -> dict[int, int]:
    """socket inode -> fd number, for the sockets process ``pid`` holds."""
    out: dict[int, int] = {}
    base = f"/proc/{pid}/fd"
    with contextlib.suppress(OSError):
        for fd in os.listdir(base):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"{base}/{fd}")
                if link.startswith("socket:["):
                    out[int(link[8:-1])] = int(fd)
    return out


def _tcp_links() -> dict[int, tuple[str, str]]:
    """inode -> (local, remote) of this network namespace's established TCP connections."""
    links: dict[int, tuple[str, str]] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "01":
                    links[int(fields[9])] = (fields[1], fields[2])
    return links


def session_links(pids: list[int]) -> dict[int, int]:
    """This rank's TCP connections to other session ranks (inode -> fd): the process group's links."""
    links = _tcp_links()
    mine = _socket_inodes("self")
    theirs = {
        (links[i][1], links[i][0])
        for pid in pids
        if pid != os.getpid()
        for i in _socket_inodes(pid)
        if i in links
    }
    return {i: fd for i, fd in mine.items() if i in links and links[i] in theirs}


def listening_ports() -> set[int] | None:
    """The TCP ports some process of this network namespace listens on (None where /proc cannot tell)."""
    ports: set[int] = set()
    read = False
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            read = True
    return ports if read else None


def wait_for_listener(port: int, within: float) -> bool:
    """Wait (polling /proc, no connection made) until ``port`` is listened on; False if it was not within ``within`` s.

    A ``TCPStore`` client that connects before its server listens backs off for a good part of a second (0.4-0.7 s measured);
    a session rank waits for rank 0's store this way instead, so a re-formed group is ready at once.
    """
    deadline = time.monotonic() + within
    while True:
        ports = listening_ports()
        if ports is None or port in ports:
            return ports is not None
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


class BreakGroup(SessionCommand):
    """Close this rank's connections to the other ranks (frees a peer stuck in a collective); no result is sent.

    ``abort()`` and ``destroy_process_group()`` leave gloo's connections open while a DDP model still
    holds the group, and a peer then waits for its 30-minute timeout. Shutting the TCP connections
    between session ranks (found by pid, so the user's own sockets are left alone) ends the peer's
    wait with "Connection closed by peer" at once.
    """

    silent = True

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)

    def run(self, rank: int) -> Any:
        for fd in session_links(self.pids).values():
            with contextlib.suppress(OSError):
                link = socket.socket(fileno=os.dup(fd))
                try:
                    link.shutdown(socket.SHUT_RDWR)
                finally:
                    link.close()
        return None


class Regroup(SessionCommand):
    """Leave the broken process group and form a fresh one on ``port`` (same ranks, same world size, same timeout).

    ``PartialState`` keeps its rank, world size and backend; only the group under it changes. The
    value sent back is ``{"value": {"stale": [...], "rebound": [...]}}``: the names of the rank's
    namespace still bound to the old group (``stale_group_holders``), and the DDP models given the
    new one (``rebind_ddp_models``).
    """

    def __init__(self, port: int) -> None:
        self.port = port

    def describe(self) -> str:
        return "re-form the process group"

    def run(self, rank: int) -> Any:
        from ...process_group import rebind_ddp_models, rejoin_process_group, stale_group_holders
        from ...state import PartialState
        from ...topology import read_topology

        state = PartialState._shared_state
        if not state.get("initialized") or not state.get("backend"):
            raise RuntimeError(
                "this rank never joined a process group (PartialState was not formed); restart the session"
            )
        os.environ["MASTER_PORT"] = str(self.port)
        topo = dict(read_topology(), master_port=self.port)
        if rank != 0 and topo["master_addr"] in _LOCAL_ADDRESSES:  # a session's ranks share this machine
            wait_for_listener(self.port, within=REGROUP_LISTEN_WAIT_S)  # else TCPStore's own retries apply
        rejoin_process_group(topo, state["backend"], state.get("collective_timeout"))
        rebound = {id(m) for m in rebind_ddp_models()}
        names = [f"{name} ({type(v).__name__})" for name, v in self.namespace.items() if id(v) in rebound]
        if rebound and not names:
            names = [f"{len(rebound)} DistributedDataParallel model{'s' if len(rebound) != 1 else ''}"]
        return {"value": {"stale": stale_group_holders(self.namespace), "rebound": names}, "names": {}}


class PostMortem(SessionCommand):
    """Open pdb at the frame where this rank's last failed cell raised (``%accelerate debug``)."""

    def describe(self) -> str:
        return "post-mortem"

    def run(self, rank: int) -> Any:
        from ..rank import debugger  # deferred: it imports pdb, which the notebook's side never needs

        return {"value": debugger.post_mortem(rank), "names": {}}


class Stop(SessionCommand):
    """Leave the loop: the rank shuts down."""


# ------------------------------------------------------------------------------------- the loop
class SessionLoop:
    """What each rank of a session runs: connect to the parent, then run its commands until ``Stop``."""

    kind = "session"

    def __init__(self, address: str, token: str) -> None:
        self.address = address
        self.token = token

    def describe(self) -> str:
        return "session"

    def serve(self, runtime: Any) -> bool:
        """The rank's whole life in a session; False (no exit barrier) when it ends."""
        from ..rank.debugger import keep_for_post_mortem  # deferred: it imports pdb (ranks only)

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.address)
        send_message(sock, ("hello", runtime.rank, self.token, os.getpid()))
        namespace = new_namespace()
        while True:
            try:
                command = recv_message(sock)
            except KeyboardInterrupt:  # an interrupt meant for a cell that had already ended
                continue
            except (EOFError, OSError):
                return False
            if isinstance(command, Stop):
                return False
            command.namespace = namespace
            cell = isinstance(command, (RunCode, RunFunction))
            try:
                if getattr(command, "silent", False):
                    command.run(runtime.rank)
                elif cell:
                    runtime.failed_with = None
                    keep_for_post_mortem(None if runtime.execute(command) else runtime.failed_with)
                else:
                    runtime.execute(command)
            except KeyboardInterrupt:  # arrived after the command had reported: nothing to undo
                continue
