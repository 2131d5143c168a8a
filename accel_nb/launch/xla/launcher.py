"""Launching on XLA devices (TPU cores, or XLA's CPU backend): one host process that runs ``torch_xla.launch``.

torch_xla starts its own processes (one per TPU chip; one process with a thread per device on the
CPU backend), so the launch machinery starts ONE rank process, the *host*, the usual way (a
spawned interpreter: never a fork of a notebook that may hold XLA state). The host calls
``torch_xla.launch`` with :func:`accel_nb.launch.xla.ordinal.ordinal_main`; every ordinal, in
whichever process or thread torch_xla puts it, connects back to a relay socket of the host and
sends its events (output, progress, its result or failure) under its own ordinal as rank. So the
notebook sees N ranks as in a CPU or GPU launch: results by ordinal, the first failure raised in
the cell with the user's traceback, every process of the host's group stopped after a failure.

A single-device runtime (Colab's v5e-1) goes the same way, not in the notebook's process: the
notebook never opens the TPU, so a failed or interrupted run cannot leave the chip held by the
kernel, and the next launch starts clean.

    rt = choose_xla(LaunchOptions())            # XlaRuntime(device='CPU', num_devices=2, ...) or None
    plan.launcher = XlaLauncher(rt)             # what make_plan does with it: one host process starts
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import xla_detect
from ...env_names import ENV_XLA_LAUNCH
from ..channel import HEADER
from ..errors import LaunchSetupError
from ..launcher import Launcher
from ..options import LaunchOptions

if TYPE_CHECKING:
    from ..parent.start import RankProcess
    from ..plan import LaunchPlan

RELAY_NAME = "xla-relay.sock"
START_METHOD_ENV = "ACCEL_NB_XLA_START_METHOD"
RELAY_DRAIN_S = 10.0  # after torch_xla.launch returns, how long the host waits for the ordinals' last events


def choose_xla(
    options: LaunchOptions, env: Any = None, installed: bool | None = None
) -> xla_detect.XlaRuntime | None:
    """The XLA runtime this launch runs on, or None for a CPU/GPU launch; ``LaunchSetupError`` for a bad mix.

    XLA when ``options.xla`` is True (the config's ``distributed_type: XLA``), or when it is None
    (auto), ``cpu`` was not asked and an XLA runtime is present (torch_xla + ``PJRT_DEVICE`` or TPU chips).
    """
    if options.cpu or options.xla is False:
        if options.cpu and options.xla:
            raise LaunchSetupError("cpu=True and xla=True ask for two different launches; pick one")
        return None
    if env is None:  # the launch's env= reaches the host: PJRT_DEVICE / CPU_NUM_DEVICES given there count
        env = {**os.environ, **options.env}
    installed = xla_detect.torch_xla_installed() if installed is None else installed
    runtime = xla_detect.xla_runtime(env, installed=installed)
    if runtime is None:
        if options.xla:
            why = (
                "torch_xla is installed but no XLA device is configured (no TPU here and PJRT_DEVICE is not set)"
                if installed
                else "torch_xla is not installed in this environment"
            )
            raise LaunchSetupError(
                f"an XLA launch was asked (distributed_type XLA / xla=True) but {why}. On a TPU runtime: "
                "pip install 'accel_nb[xla]'; elsewhere: run `accel-nb config` again or pass cpu=True"
            )
        return None
    if runtime.device not in ("TPU", "CPU"):
        raise LaunchSetupError(
            f"PJRT_DEVICE={runtime.device}: accel_nb launches on XLA's TPU and CPU devices only; unset "
            "PJRT_DEVICE for a GPU launch (or pass xla=False)"
        )
    n = runtime.num_devices
    if options.num_processes is not None and options.num_processes != n:
        raise LaunchSetupError(
            f"num_processes={options.num_processes} but this XLA runtime has {n} device{'s' if n != 1 else ''} "
            f"({runtime.why}); torch_xla runs one rank per device: leave num_processes out or give {n}"
            + (", or pass cpu=True for CPU processes" if runtime.device == "CPU" else "")
        )
    if options.start_method == "fork":
        raise LaunchSetupError(
            "start_method='fork' cannot start an XLA launch: torch_xla starts its own processes from a "
            "clean host process; use start_method='auto' or 'spawn'"
        )
    if runtime.device == "TPU" and runtime_started_here():
        raise LaunchSetupError(
            "this notebook's process already opened the TPU (torch_xla's runtime was started here, e.g. by "
            "torch_xla.device() in a cell), so the launched cores cannot use it; restart the kernel and "
            "launch before touching the XLA device in the notebook"
        )
    try:
        ordinal_start_method(env)
    except ValueError as exc:
        raise LaunchSetupError(f"{exc}; unset it or give one of the two") from None
    if options.num_nodes > 1:
        raise LaunchSetupError(
            "num_nodes > 1 with XLA devices: a TPU pod slice of several hosts is not supported from a "
            "notebook; run on one TPU host"
        )
    return runtime


def runtime_started_here() -> bool:
    """Whether this process started torch_xla's runtime (a TPU is then held by it); never imports torch_xla."""
    import sys

    torch_xla = sys.modules.get("torch_xla")
    xlac = getattr(torch_xla, "_XLAC", None)
    started = getattr(xlac, "_xla_runtime_is_initialized", None)
    return bool(started()) if started is not None else False


class XlaLauncher(Launcher):
    """The XLA launch kind: ONE spawned host process runs ``torch_xla.launch``; its ordinals report as ranks 0..N-1."""

    def __init__(self, runtime: xla_detect.XlaRuntime) -> None:
        self.runtime = runtime

    def __repr__(self) -> str:
        return f"XlaLauncher({self.runtime!r})"

    def backend(self, plan: LaunchPlan) -> str:
        return "xla"

    def headline(self, plan: LaunchPlan) -> str:
        return xla_headline(plan)

    def rank_env(self, plan: LaunchPlan, rank: int) -> dict[str, str]:
        return xla_rank_env(plan)

    def session_problem(self, plan: LaunchPlan) -> str | None:
        return (
            "a session keeps its ranks alive between cells, and torch_xla.launch runs a function once: on "
            "XLA devices launch each cell with %%accelerate or notebook_launcher (or hold a session of CPU "
            "processes with cpu=True)"
        )

    def start(self, plan: LaunchPlan, payload: Any, log_dir: str, procs: list[RankProcess]) -> None:
        """One rank process, the host, running an ``XlaHostPayload`` (started the usual way: spawned)."""
        from ..parent.start import start_ranks

        host_plan = dataclasses.replace(plan, num_processes=1)
        host_payload = XlaHostPayload(payload, plan.num_processes, self.runtime.why)
        start_ranks(host_plan, host_payload, log_dir, procs)


def xla_rank_env(plan: LaunchPlan) -> dict[str, str]:
    """The host's environment: accel_nb's settings only (torch_xla gives each ordinal its rank, not RANK=)."""
    runtime = plan.launcher.runtime
    env = {ENV_XLA_LAUNCH: "1", "PJRT_DEVICE": runtime.device}
    if runtime.device == "CPU":
        env["CPU_NUM_DEVICES"] = str(runtime.num_devices)
    env.update(plan.training_env())
    env.update(plan.options.env)
    return env


def xla_headline(plan: LaunchPlan) -> str:
    n = plan.num_processes
    device = plan.launcher.runtime.device
    devices = f"{n} {'TPU' if device == 'TPU' else 'XLA ' + device} device{'s' if n != 1 else ''}"
    how = "threads of one process" if device == "CPU" else "torch_xla's processes"
    extra = f", mixed_precision={plan.mixed_precision}" if plan.mixed_precision not in (None, "no") else ""
    return f"Launching on {devices} through torch_xla.launch ({how}, started by one host process){extra}..."


@dataclass(frozen=True)
class OrdinalInfo:
    """What every ordinal needs from the host (pickled by torch_xla into its processes)."""

    relay_path: str
    log_dir: str
    host_pid: int
    world_size: int
    why: str  # what the plan's device count came from, for a mismatch error


class XlaHostPayload:
    """The host's work: ``torch_xla.launch`` the user's payload on every ordinal, relaying their events."""

    kind = "xla-host"

    def __init__(self, payload: Any, world_size: int, why: str) -> None:
        self.payload = payload
        self.world_size = world_size
        self.why = why

    def describe(self) -> str:
        return self.payload.describe()

    def serve(self, runtime: Any) -> bool:
        """Run every ordinal; True when torch_xla ran them all (each reported its own result or failure)."""
        import cloudpickle

        from .ordinal import ordinal_main

        log_dir = runtime.spec.log_dir
        relay = Relay(os.path.join(log_dir, RELAY_NAME), runtime.writer)
        info = OrdinalInfo(relay.path, log_dir, os.getpid(), self.world_size, self.why)
        try:
            blob = cloudpickle.dumps(self.payload)
            import torch_xla

            with warnings.catch_warnings():  # Python 3.12 warns about forking a process with threads
                warnings.filterwarnings(
                    "ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning
                )
                torch_xla.launch(ordinal_main, args=(blob, info), start_method=ordinal_start_method())
        except BaseException as exc:  # noqa: BLE001 - torch_xla itself failed (not the user's function)
            relay.close(RELAY_DRAIN_S)
            if type(exc).__name__ == "BrokenProcessPool":  # an ordinal's process died: say where it was
                return runtime.report_failure(
                    OrdinalProcessDied(_crash_stacks(log_dir)), with_traceback=False
                )
            return runtime.report_failure(exc)
        relay.close(RELAY_DRAIN_S)
        return True


class OrdinalProcessDied(RuntimeError):
    """A process torch_xla started for the devices ended abruptly (a crash in native code, or a kill)."""


def _crash_stacks(log_dir: str) -> str:
    """What the host's faulthandler file says about a crash (forked ordinal processes share it)."""
    from ..parent.supervisor import clean_stacks, read_tail
    from ..rank.worker import crash_path

    stacks = clean_stacks(read_tail(crash_path(log_dir, 0), 200))
    where = (
        f"; Python stacks at the crash (faulthandler):\n{stacks}"
        if stacks
        else " (no Python stack was recorded)"
    )
    return (
        "a process torch_xla started for the XLA devices ended abruptly (a crash in native code such as "
        f"a segmentation fault, or a kill){where}"
    )


def ordinal_start_method(env: Any = None) -> str:
    """How torch_xla starts its processes from the host: ``fork`` (default) or ``spawn`` (``ACCEL_NB_XLA_START_METHOD``).

    The host is a clean interpreter that imported torch and torch_xla but never started the XLA
    runtime or ran a torch operation, so forking it is safe, and it saves every ordinal process
    a fresh interpreter importing torch and torch_xla again (seconds per launch).
    """
    env = os.environ if env is None else env
    method = env.get(START_METHOD_ENV, "").strip() or "fork"
    if method not in ("fork", "spawn"):
        raise ValueError(f"{START_METHOD_ENV}={method!r} is not 'fork' or 'spawn'")
    return method


class Relay:
    """A Unix socket in the launch's log folder: each ordinal connects and sends event frames; they go out on ``writer``."""

    def __init__(self, path: str, writer: Any) -> None:
        self.path = path
        self.writer = writer
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._closing = threading.Event()
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="accel_nb-xla-relay", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._start_pump(conn)

    def _start_pump(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        reader = threading.Thread(target=self._pump, args=(conn,), name="accel_nb-xla-pump", daemon=True)
        with self._lock:
            self._readers.append(reader)
        reader.start()

    def _pump(self, conn: socket.socket) -> None:
        """Forward whole frames only, so frames of different ordinals never interleave on the host's pipe."""
        buf = bytearray()
        with conn:
            while True:
                try:
                    chunk = conn.recv(1 << 16)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= HEADER.size:
                    (size,) = HEADER.unpack_from(buf, 0)
                    end = HEADER.size + size
                    if len(buf) < end:
                        break
                    frame = bytes(buf[:end])
                    del buf[:end]
                    with contextlib.suppress(OSError):  # the notebook is gone: nothing to tell
                        self.writer.send_frame(frame)

    def close(self, wait: float) -> None:
        """Stop accepting; wait up to ``wait`` seconds for connected ordinals to finish sending."""
        self._closing.set()
        self._acceptor.join(timeout=1.0)
        self._sock.setblocking(False)
        while True:  # an ordinal that connected and ended between two accepts
            try:
                conn, _ = self._sock.accept()
            except OSError:
                break
            self._start_pump(conn)
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            reader.join(timeout=wait)
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
