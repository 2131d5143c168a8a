"""The one rank entry: set the rank up, run its payload, report the result or the failure, shut down.

A rank is forked from the notebook (``fork_main``), forked by the spawn server (``zygote``) or started
as a fresh interpreter (both ``spawn_main``, which loads the cloudpickled payload). Both build a
``WorkerRuntime``: it dies with its parent, captures fds 1/2 into events and a log file,
installs the event sink (``accel_nb.events.set_event_sink``), registers faulthandler (the
supervisor asks for every thread's stack on a hang or an interrupt), runs ``execute(payload)``
once, sends a ``Result`` or a ``Failure``, and closes its channel in ``shutdown()`` before ``os._exit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from ... import events
from ...availability import imported_module
from ...env_names import ENV_FORKED
from .. import kernel_debugger
from ..channel import ChannelClosed, EventWriter, encode_event
from . import tqdm_bridge
from .capture import OutputCapture

HEARTBEAT_S = 2.0
EXIT_BARRIER_S = 60.0  # after success, ranks wait this long for each other before leaving the group
STACKS_SIGNAL = signal.SIGUSR1
_LAUNCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # accel_nb/launch


@dataclass
class RankSpec:
    """Everything a rank needs to know about its launch (JSON-able: spawned ranks read it from a file)."""

    rank: int
    world_size: int
    log_dir: str
    event_fd: int
    parent_pid: int
    forked: bool
    env: dict[str, str] = field(default_factory=dict)
    sys_path: list[str] | None = None
    cwd: str | None = None
    payload_path: str | None = None
    threads: int | None = None  # torch threads to use (forced to 1 when the parent's OpenMP pool ran)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def log_path(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"rank{rank}.log")


def stacks_path(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"rank{rank}.stacks")


def crash_path(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"rank{rank}.crash")


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this rank when the launching process dies (kernel restart or crash)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no libc / no prctl: the check below still runs
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def to_cpu(value: Any, _depth: int = 0) -> Any:
    """Move tensors and modules inside ``value`` to the CPU so the notebook can load them anywhere."""
    torch = imported_module("torch")
    if torch is None or _depth > 20:
        return value
    if isinstance(value, torch.Tensor):
        if value.requires_grad and not value.is_leaf:
            value = value.detach()
        return value.cpu() if value.device.type != "cpu" else value
    if isinstance(value, torch.nn.Module):
        inner = getattr(value, "module", None)
        if isinstance(inner, torch.nn.Module) and type(value).__name__ in (
            "DistributedDataParallel",
            "DataParallel",
        ):
            value = inner
        return value.cpu()
    if isinstance(value, dict):
        items = [(k, to_cpu(v, _depth + 1)) for k, v in value.items()]
        try:
            return type(value)(items)
        except TypeError:  # a dict subclass whose constructor takes other arguments: plain dict
            return dict(items)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_cpu(v, _depth + 1) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v, _depth + 1) for v in value)
    return value


def format_exception(exc: BaseException) -> str:
    """The traceback with the launcher's own frames removed (the user's frames stay)."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_LAUNCH_DIR):
        tb = tb.tb_next
    return "".join(traceback.TracebackException(type(exc), exc, tb).format())


def _portable_exception(exc: BaseException) -> BaseException | None:
    """``exc`` itself when it survives a pickle round trip, else None (the text still travels)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return None


def native_threads_running() -> bool:
    """True when this process runs threads Python did not start (e.g. an OpenMP pool after a matmul).

    An OpenMP pool does not survive a fork: a forked rank that uses more than one torch thread
    then hangs in its first parallel operation, so forked ranks use one thread in that case.
    """
    try:
        with open("/proc/self/comm") as f:
            name = f.read().strip()
        same = 0
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    same += 1
    except OSError:
        return True  # cannot tell: be safe
    return same > threading.active_count()


def _set_torch_threads(forced: int | None) -> None:
    torch = imported_module("torch")
    if torch is None:
        return
    wanted = forced
    if wanted is None:
        with contextlib.suppress(ValueError):
            wanted = int(os.environ.get("OMP_NUM_THREADS", "") or 0) or None
    if wanted:
        with contextlib.suppress(RuntimeError):  # torch refuses once its pool is in use: keep its count
            torch.set_num_threads(wanted)


def _publish_as_text(data: dict, metadata: Any = None, *args: Any, **kwargs: Any) -> None:
    """A rank's ``display(x)``: x's plain-text form, printed (so captured like any output)."""
    text = data.get("text/plain")
    if text is not None:
        print(text, flush=True)


def _no_clear_output(wait: bool = False) -> None:
    """A rank's ``clear_output()``: nothing to clear in a rank's captured output."""
    return None


def _drop_kernel_message(*args: Any, **kwargs: Any) -> None:
    """Stands in for the kernel session's ``send`` inside a rank: the rank owns no kernel socket."""
    return None


def _detach_from_kernel() -> None:
    """In a rank forked from a Jupyter kernel: display() and input() must not use the kernel's sockets."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:  # the kernel's loop object was copied with dead sockets: not the rank's loop
        asyncio.set_event_loop(None)
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    # display(x) in a rank prints x's plain-text form into the rank's captured output. The shell's own
    # publisher gets the two methods on the instance: a publisher class of our own (a traitlets class
    # made and instantiated in every rank) cost ~2 ms of each rank's start
    publisher = shell.display_pub
    publisher.publish = _publish_as_text
    publisher.clear_output = _no_clear_output
    kernel = getattr(shell, "kernel", None)
    session = getattr(kernel, "session", None)
    if session is not None:
        # Widgets and comms a rank creates (ipywidgets.IntSlider(), a library's live plot) send
        # through the kernel's session; in a fork those sockets belong to the kernel, so such
        # messages are dropped here instead of being refused with "send message from fork".
        session.send = _drop_kernel_message
    import builtins

    def _no_input(prompt: str = "") -> str:
        raise RuntimeError(
            "input() is not available inside a launched rank: it has no keyboard; pass values as arguments"
        )

    builtins.input = _no_input


class WorkerRuntime:
    """One rank's process-wide setup; ``execute`` runs payloads and reports how they ended."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.rank = spec.rank
        self.writer = EventWriter(spec.event_fd)
        self.capture: OutputCapture | None = None
        self._stop = threading.Event()
        self._files: list[Any] = []
        self.failed_with: BaseException | None = None  # what the last failed payload raised

    # -- lifecycle ----------------------------------------------------------------------------
    def setup(self) -> None:
        spec = self.spec
        die_with_parent(spec.parent_pid)
        self._install_faulthandler()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked around the fork (see start)
        if spec.env:
            os.environ.update(spec.env)
        if spec.forked:
            os.environ[ENV_FORKED] = "1"
            if "accel_nb.state" in sys.modules:  # the notebook may hold a PartialState of its own
                sys.modules["accel_nb.state"]._reset_all_states()
        _set_torch_threads(spec.threads)
        if spec.sys_path is not None:
            sys.path[:] = spec.sys_path
        if spec.cwd:
            with contextlib.suppress(OSError):
                os.chdir(spec.cwd)
        self.capture = OutputCapture(self.rank, self.send, log_path(spec.log_dir, self.rank))
        self.capture.start()
        if spec.forked:
            _detach_from_kernel()
        events.set_event_sink(self.send)
        from . import debugger  # deferred: it imports pdb, which the launching side never needs

        debugger.install(
            self.rank, spec.log_dir
        )  # breakpoint() and pdb.set_trace(): the launching process's prompt
        tqdm_bridge.install()  # library tqdm bars -> this rank's progress row, not the kernel's sockets
        threading.Thread(target=self._heartbeat, name="accel_nb-heartbeat", daemon=True).start()
        self.send(events.Phase(rank=self.rank, phase="started"))

    def _install_faulthandler(self) -> None:
        stacks = open(stacks_path(self.spec.log_dir, self.rank), "w")  # noqa: SIM115 - lives as long as the rank
        crash = open(crash_path(self.spec.log_dir, self.rank), "w")  # noqa: SIM115
        self._files += [stacks, crash]
        faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True, chain=False)
        faulthandler.enable(file=crash, all_threads=True)

    def send(self, event: events.Event) -> None:
        """Send one event to the parent; a closed channel (the parent is gone) drops it."""
        try:
            self.writer.send(event)
        except ChannelClosed:
            pass

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.send(events.Heartbeat(rank=self.rank, time=time.time()))

    def execute(self, payload: Any) -> bool:
        """Run one payload; send ``Result`` or ``Failure``. True when it succeeded."""
        self.send(events.Phase(rank=self.rank, phase="running"))
        try:
            value = payload.run(self.rank)
        except SystemExit as exc:
            if exc.code in (None, 0):
                value = None
            else:
                return self.report_failure(exc)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
            return self.report_failure(exc)
        try:
            frame = encode_event(events.Result(rank=self.rank, value=to_cpu(value)))
        except Exception as exc:  # noqa: BLE001 - any pickling error: say which value
            return self.report_failure(
                TypeError(payload.unsendable(self.rank, value, exc)), with_traceback=False
            )
        self._sync_output()
        with contextlib.suppress(ChannelClosed):
            self.writer.send_frame(frame)
        return True

    def run_payload(self, payload: Any) -> bool:
        """A payload with a ``serve(runtime)`` loop (an interactive session) runs its loop; any other runs once."""
        serve = getattr(payload, "serve", None)
        return serve(self) if serve is not None else self.execute(payload)

    def report_failure(self, exc: BaseException, with_traceback: bool = True) -> bool:
        text = format_exception(exc) if with_traceback else f"{type(exc).__name__}: {exc}\n"
        self.failed_with = exc  # a session keeps a failed cell's exception for %accelerate debug
        self._sync_output()
        self.send(
            events.Failure(
                rank=self.rank,
                exc_type=type(exc).__name__,
                message=str(exc),
                traceback=text,
                exception=_portable_exception(exc),
            )
        )
        return False

    def _sync_output(self) -> None:
        if self.capture is not None:
            self.capture.sync()

    def shutdown(self, succeeded: bool = True) -> None:
        """Send the last output and close the channel; the process then ends with ``os._exit``.

        The process group is not torn down: ``os._exit`` ends gloo's threads with the process (no
        interpreter finalisation, so none of them can abort it with "terminate called ..."), and the
        peers see the same closed connections a local teardown would leave them; that teardown
        (joining gloo's threads, ~20 ms) would only delay the end of the launch.
        """
        self._stop.set()
        dist = sys.modules.get("torch.distributed")  # only a rank that imported it can have a group
        # a group a dead peer broke raises here; that must not hide the rank's own result
        with contextlib.suppress(Exception):
            if succeeded and dist is not None and dist.is_available() and dist.is_initialized():
                from ...state import PartialState

                # a group formed by PartialState finished its handshakes when it formed; groups made
                # after it (a DeviceMesh's, new_group) may not have on every rank: rank 0 also hosts
                # the store their handshakes go through, so it must not leave before the others
                formed_by_state = bool(PartialState._shared_state.get("_owns_group"))
                if dist.get_backend() == "gloo" and (not formed_by_state or _has_subgroups(dist)):
                    # a rank that returns right after joining must not close its connections
                    # while a peer is still finishing gloo's connection handshake
                    # a peer that already left: nothing to wait for
                    with contextlib.suppress(RuntimeError):
                        dist.monitored_barrier(timeout=datetime.timedelta(seconds=EXIT_BARRIER_S))
                elif _has_subgroups(dist):  # NCCL and others: no monitored_barrier; the store host waits
                    _check_out(dist)
        if self.capture is not None:
            self.capture.stop()
        events.set_event_sink(None)
        self.writer.close()


def _own_process_group(rank: int) -> None:
    """Put this forked rank in a process group of its own (the supervisor signals the group)."""
    try:
        os.setpgid(0, 0)
    except OSError as exc:  # EPERM: e.g. a session leader; the rank still runs, signals reach it alone
        os.write(2, f"[accel_nb] rank {rank}: cannot get a process group of its own ({exc})\n".encode())


def fork_main(spec: RankSpec, payload: Any, close_fds: list[int] = ()) -> NoReturn:
    """Entry of a forked rank: close the parent's ends in ``close_fds``, run, exit; never returns to the notebook's code."""
    code = 70
    try:
        kernel_debugger.drop_inherited_tracer()  # the kernel's debugger's threads did not come along
        for fd in close_fds:
            with contextlib.suppress(OSError):  # EBADF only: nothing of the rank's is at stake
                os.close(fd)
        _own_process_group(spec.rank)
        runtime = WorkerRuntime(spec)
        runtime.setup()
        code = 0 if runtime.run_payload(payload) else 1
        runtime.shutdown(succeeded=code == 0)
    except BaseException:  # noqa: BLE001 - the last resort: say something on the log, then exit
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(code)


def spawn_main(argv: list[str] | None = None) -> NoReturn:
    """Entry of a spawned rank: ``<spec.json> <rank> <event fd> [parent pid]``; loads the cloudpickled payload.

    The optional parent pid is the spawn server's when the rank was forked by it (see ``zygote``).
    """
    argv = sys.argv[1:] if argv is None else argv
    code = 70
    try:
        spec_file, rank, fd = argv[0], int(argv[1]), int(argv[2])
        with open(spec_file) as f:
            data = json.load(f)
        data.update(rank=rank, event_fd=fd)
        if len(argv) > 3:
            data["parent_pid"] = int(argv[3])
        spec = RankSpec(**data)
        runtime = WorkerRuntime(spec)
        runtime.setup()
        try:
            import cloudpickle

            with open(spec.payload_path, "rb") as f:
                payload = cloudpickle.load(f)
        except BaseException as exc:  # noqa: BLE001
            runtime.report_failure(exc)
            code = 1
        else:
            code = 0 if runtime.run_payload(payload) else 1
        runtime.shutdown(succeeded=code == 0)
    except BaseException:  # noqa: BLE001
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(code)


def _check_out(dist) -> None:
    """Each rank marks its end on the default store; rank 0, which hosts that store in accel_nb's
    launches, waits (up to EXIT_BARRIER_S) until every rank has, so that a peer still forming a group
    through the store (NCCL exchanges its communicator ids there) does not lose it. Peers leave at once."""
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(f"accel_nb/check_out/{rank}", "1")
    if rank == 0:
        keys = [f"accel_nb/check_out/{r}" for r in range(world)]
        store.wait(keys, datetime.timedelta(seconds=EXIT_BARRIER_S))


def _has_subgroups(dist) -> bool:
    """True when groups besides the default one were created on this rank, member or not (or when
    that cannot be told: then assume so). A rank outside a new group still made it: its peers'
    handshake for it may still be running through rank 0's store."""
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    count = getattr(world, "group_count", None)
    return not isinstance(count, int) or count > 1
