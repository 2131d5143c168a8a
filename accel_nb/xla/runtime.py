"""torch_xla's runtime as accel_nb uses it: device, ordinal, world size, and the graph lock.

Imported by ``accel_nb.state`` (so it stays light: torch_xla is imported only once a run really
uses XLA devices). ``PartialState`` calls :func:`use_xla`; the rest of accel_nb asks
:func:`in_use` before taking an XLA code path.

Two facts shape this module:

- torch_xla runs each device's work as lazily traced graphs; ``sync()`` compiles and launches the
  pending graph. On XLA's CPU backend with several devices (``PJRT_DEVICE=CPU
  CPU_NUM_DEVICES=2``) the devices are *threads of one process*: two threads compiling a graph
  with a collective at the same time deadlock. Every sync that may hold a collective therefore
  runs under one process-wide lock (:func:`graph_lock`); launching is asynchronous, so the lock is
  released before the collective waits for the other devices.
- In that threaded case the shared state of ``PartialState`` must be per thread (one per
  ordinal): :func:`devices_are_threads` tells ``accel_nb.state`` so. On TPUs torch_xla runs one
  process per chip and nothing is per thread.

    from accel_nb.xla import runtime
    if runtime.use_xla(cpu=False):
        topo = runtime.topology()       # {"device": device(type='xla', index=0), "world_size": 2, ...}
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = [
    "StateStore",
    "use_xla",
    "in_use",
    "devices_are_threads",
    "topology",
    "device",
    "ordinal",
    "world_size",
    "graph_lock",
    "sync",
    "launch",
    "run_collective",
    "barrier",
    "rng_state",
    "set_rng_state",
]

_IN_USE = False  # a PartialState of this process chose XLA devices
_THREADED = False  # this process drives several XLA devices, one thread each (XLA's CPU backend)
# Serialises graph compilation and launch across the device threads of this process. Re-entrant:
# a locked helper may call another.
_GRAPH_LOCK = threading.RLock()
# With devices as threads: every device thread launches a collective before any waits for a result
_THREAD_BARRIER: threading.Barrier | None = None


_STORES: list[StateStore] = []  # every StateStore made (PartialState's, AcceleratorState's, GradientState's)


def fresh_thread_state() -> None:
    """Give this thread empty states (every ``StateStore``), whatever ran on it before.

    ``torch_xla.launch`` runs the devices' functions on a thread pool, which may run a second device's
    function on the thread the first one finished on (seen for short functions: 5 launches in 16 on the
    2-core test machine). The first device's states were then still in the thread and the second took
    them: both reported rank 0 on ``xla:0``. Each device's entry calls this first.
    """
    for store in _STORES:
        store._threads.state = {}


class StateStore:
    """The dict every instance of a state class shares: one per process, or one per thread while XLA
    runs several devices as threads of this process (XLA's CPU backend: one "rank" per thread).

        class PartialState:
            _shared_state = StateStore()     # self.__dict__ = self._shared_state in __init__
    """

    def __init__(self) -> None:
        self._process: dict[str, Any] = {}
        self._threads = threading.local()
        _STORES.append(self)

    def __get__(self, obj: Any, owner: Any) -> dict[str, Any]:
        if not _THREADED:
            return self._process
        state = getattr(self._threads, "state", None)
        if state is None:
            state = self._threads.state = {}
        return state


def configured(env: Any = None) -> bool:
    """Whether torch_xla is installed and a PJRT device is configured (``PJRT_DEVICE``, or TPU chips here).

    Read without importing torch_xla (``accel_nb.xla_detect``).
    """
    from ..xla_detect import xla_runtime

    return xla_runtime(env) is not None


def use_xla(cpu: bool) -> bool:
    """Whether this process's ``PartialState`` runs on XLA devices; the first True starts the runtime.

    False with ``cpu=True`` (the user asked for the CPU) or without a configured XLA runtime.
    """
    global _IN_USE, _THREADED, _THREAD_BARRIER
    if _IN_USE:
        return not cpu
    if cpu or not configured():
        return False
    import torch_xla.runtime as xr

    with _GRAPH_LOCK:  # the device threads start together: one of them sets this up
        if not _IN_USE:
            local_devices = int(xr.addressable_device_count())
            _THREADED = local_devices > 1
            _THREAD_BARRIER = threading.Barrier(local_devices) if _THREADED else None
            _IN_USE = True
    return True


def in_use() -> bool:
    """Whether a ``PartialState`` of this process chose XLA devices (collectives, loaders, checkpoints follow)."""
    return _IN_USE


def devices_are_threads() -> bool:
    """Whether this process drives several XLA devices, one thread each (XLA's CPU backend)."""
    return _THREADED


def device() -> Any:
    """This thread's XLA device (``xla:N``)."""
    import torch_xla

    return torch_xla.device()


def ordinal() -> int:
    """This device's global ordinal (its rank)."""
    import torch_xla.runtime as xr

    return int(xr.global_ordinal())


def world_size() -> int:
    """How many XLA devices take part in the run (1 when torch_xla runs without replication)."""
    import torch_xla.runtime as xr

    return int(xr.world_size())


def topology() -> dict[str, Any]:
    """Device, world size, rank, local rank and local world size, from torch_xla's runtime."""
    import torch_xla.runtime as xr

    world = int(xr.world_size())
    local_world = int(xr.local_device_count()) if world > 1 else 1
    return {
        "device": device(),
        "world_size": world,
        "rank": int(xr.global_ordinal()) if world > 1 else 0,
        "local_rank": int(xr.local_ordinal()) if world > 1 else 0,
        "local_world_size": min(local_world, world),
    }


@contextlib.contextmanager
def graph_lock() -> Iterator[None]:
    """Hold the process-wide lock that serialises graph compilation (see the module's docstring)."""
    with _GRAPH_LOCK:
        yield


def devices_meet() -> None:
    """With devices as threads: wait until every device thread got here (after launching a collective,
    before reading its result). Nothing on TPUs (one process per chip).

    Waits at most ``ACCEL_NB_COLLECTIVE_TIMEOUT`` seconds (30 minutes by default), then raises a
    ``RuntimeError`` naming the cause, in every device thread still waiting.
    """
    if _THREAD_BARRIER is None:
        return
    from ..env_names import ENV_COLLECTIVE_TIMEOUT
    from ..process_group import DEFAULT_COLLECTIVE_TIMEOUT_S, seconds_from_env

    seconds = seconds_from_env(ENV_COLLECTIVE_TIMEOUT, DEFAULT_COLLECTIVE_TIMEOUT_S)
    try:
        _THREAD_BARRIER.wait(timeout=seconds)
    except threading.BrokenBarrierError:
        raise RuntimeError(
            f"XLA device {ordinal()} waited for the other device threads at a collective, in vain (for "
            f"{seconds:g} s, or another device gave up): a device failed or skipped this collective. Every "
            f"rank must call the same collectives in the same order; {ENV_COLLECTIVE_TIMEOUT} sets the wait"
        ) from None


def sync() -> None:
    """Compile and launch this device's pending graph (``torch_xla.sync()``) under the graph lock."""
    import torch_xla

    with _GRAPH_LOCK:
        torch_xla.sync()


def launch(tensors: Any) -> None:
    """Compile and launch the pending work of ``tensors`` only, under the graph lock, without waiting.

    For a graph with a collective: ``torch_xla.sync()`` would take in every live tensor of this
    device with pending work, and anything one device thread alone still holds makes its graph
    another program, compiled apart from the other threads' one. On XLA's CPU backend two
    compilations of a collective never meet in XLA's rendezvous (docs/tpu.md).
    """
    import torch_xla

    with _GRAPH_LOCK:
        torch_xla._XLAC._xla_sync_multi(list(tensors), devices=[], wait=False, sync_xla_data=False)


def run_collective(tensors: Any) -> None:
    """Launch the collective graph of ``tensors`` alone (:func:`launch`); with devices as threads, wait until it ran.

    With devices as threads every device thread then meets the others (all launched the same
    program) and waits until its own device finished the collective, before it traces or launches
    anything else. Launching the next graph while the collective was still in flight let XLA's CPU
    backend abort now and then: one device waited alone in the collective's rendezvous while its
    thread waited in ``torch_xla.sync()`` for the next graph (docs/tpu.md). Call it outside
    :func:`graph_lock` (it meets the other device threads).
    """
    import torch_xla

    launch(tensors)
    if _THREAD_BARRIER is None:
        return
    devices_meet()
    torch_xla._XLAC._xla_wait_device_ops(devices=torch_xla._XLAC._xla_real_devices([str(device())]))


def barrier() -> None:
    """Block until every device reaches this line: a one-element all-reduce, waited for."""
    import torch
    import torch_xla.core.xla_model as xm

    sync()
    devices_meet()  # see accel_nb.xla.collectives: no flush while a collective is launched
    with _GRAPH_LOCK:
        token = xm.all_reduce(xm.REDUCE_SUM, torch.ones(1, device=device()))
    run_collective([token])
    token.cpu()  # waits for the collective (on TPUs too), outside the lock


def rng_state() -> int:
    """This device's XLA random seed state (``xm.get_rng_state``)."""
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state())


def set_rng_state(state: int) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(int(state))
