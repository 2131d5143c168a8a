"""Forming the process group: a TCP store with a bounded connect time, then torch's group on it.

``PartialState`` calls :func:`join_process_group` once per process; the backend and the collective
timeout it may be given are checked here too (and that it is given no other keyword), with errors that
name the cause and the fix.

    join_process_group(read_topology(), "gloo", collective_timeout=60.0)
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import math
import os
import types
from typing import Any

import torch.distributed as dist

from .env_names import ENV_COLLECTIVE_TIMEOUT, ENV_RENDEZVOUS_TIMEOUT

__all__ = [
    "ENV_RENDEZVOUS_TIMEOUT",
    "ENV_COLLECTIVE_TIMEOUT",
    "DEFAULT_RENDEZVOUS_TIMEOUT_S",
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "RendezvousError",
    "join_process_group",
    "release_process_groups",
    "rejoin_process_group",
    "rebind_ddp_models",
    "stale_group_holders",
    "set_group_timeout",
    "check_backend",
    "timeout_seconds",
    "PROCESS_GROUP_KEYWORDS",
    "check_state_keywords",
]

DEFAULT_RENDEZVOUS_TIMEOUT_S = 60.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0

# process-group backends PartialState(backend=...) accepts, with torch's check that it is built in
_BACKENDS = {
    "gloo": dist.is_gloo_available,
    "nccl": dist.is_nccl_available,
    "mpi": dist.is_mpi_available,
    "ucc": dist.is_ucc_available,
}


class RendezvousError(RuntimeError):
    """This process could not join the process group (main process unreachable, peers missing)."""


def seconds_from_env(name: str, default: float) -> float:
    """The number of seconds in the environment variable ``name`` (``default`` when unset or empty)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None


def join_process_group(topo: dict[str, Any], backend: str, collective_timeout: float | None) -> None:
    """Create the store with a bounded connect time, then the process group on it.

    ``collective_timeout`` (seconds; None: ``ACCEL_NB_COLLECTIVE_TIMEOUT`` or 30 minutes) bounds
    every collective once the group is formed.
    """
    rdzv_timeout = seconds_from_env(ENV_RENDEZVOUS_TIMEOUT, DEFAULT_RENDEZVOUS_TIMEOUT_S)
    coll_timeout = (
        collective_timeout
        if collective_timeout is not None
        else seconds_from_env(ENV_COLLECTIVE_TIMEOUT, DEFAULT_COLLECTIVE_TIMEOUT_S)
    )
    rank, world = topo["rank"], topo["world_size"]
    addr, port = topo["master_addr"], topo["master_port"]
    # Under torchrun's elastic agent the agent already hosts the store on MASTER_PORT.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    where = f"{addr}:{port}"
    try:
        store = dist.TCPStore(
            addr,
            port,
            world_size=world,
            is_master=(rank == 0 and not agent_store),
            timeout=datetime.timedelta(seconds=rdzv_timeout),
            wait_for_workers=False,
        )
    except Exception as exc:  # DistNetworkError, RuntimeError, TimeoutError depending on torch
        if rank == 0 and not agent_store:
            cause = f"rank 0 could not listen on {where}"
            fix = "the port is probably in use: pick another MASTER_PORT (or let the launcher pick one)"
        else:
            cause = f"rank {rank} could not reach the main process at {where} within {rdzv_timeout:g} s"
            fix = (
                "check that rank 0 is running and that MASTER_ADDR/MASTER_PORT are reachable from this "
                f"machine, or allow more time with {ENV_RENDEZVOUS_TIMEOUT}=<seconds>"
            )
        raise RendezvousError(
            f"{cause} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); {fix}"
        ) from exc
    if agent_store:
        # the agent's store outlives a restart: each round of ranks gets its own keys, else the
        # restarted ranks read the dead ranks' addresses. The round is how many times this global
        # rank joined (the same for every rank of a round), not TORCHELASTIC_RESTART_COUNT: an agent
        # that restarts its ranks because another machine rejoined does not count that restart.
        attempt = store.add(f"/accel_nb/rank_joins/{rank}", 1)
        store = dist.PrefixStore(f"/worker/attempt_{attempt}", store)
    try:
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=rdzv_timeout),
        )
        if backend == "gloo":
            # finish every pair's handshake now: a rank that leaves right after joining could
            # otherwise break a peer's half-open connection
            dist.barrier()
        # the rendezvous is over: collectives get the long timeout from here on
        set_group_timeout(coll_timeout)
        if backend == "gloo":
            # once, however often this process re-forms a group
            atexit.unregister(_destroy_gloo_group_at_exit)
            atexit.register(_destroy_gloo_group_at_exit)
    except Exception as exc:
        # teardown of the half-formed group: the RendezvousError below carries the cause, and a
        # second failure while leaving would only hide it
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        raise RendezvousError(
            f"rank {rank} of {world} could not form the {backend} group at {where} within "
            f"{rdzv_timeout:g} s ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"are all {world} ranks started? Allow more time with {ENV_RENDEZVOUS_TIMEOUT}=<seconds>"
        ) from exc


def _destroy_gloo_group_at_exit() -> None:
    """Tear the gloo group down at exit while the interpreter is still whole, so no rank aborts after its last line.

    Gloo's worker threads free each finished collective after the caller's ``wait()`` returned; when
    that frees a tensor Python still knows, the thread takes the GIL. Once the interpreter is
    finalising, taking the GIL ends the thread (``pthread_exit``), which C++ turns into
    "terminate called without an active exception" (SIGABRT) although the script finished. Only the
    group's destructor waits for those threads, and ``destroy_process_group()`` alone does not run
    it while a ``DistributedDataParallel`` model's reducer still holds the group: the reducers are
    released here too. Gloo's teardown is local (no collective), so this cannot hang on a peer.
    """
    with contextlib.suppress(Exception):  # exiting anyway: a failed teardown must not mask the exit status
        release_process_groups()


def release_process_groups() -> int:
    """Destroy the default group and drop every hold on a group that would keep it alive; returns the DDP models released.

    Holders: a ``DistributedDataParallel`` model's reducer (and its logger), and the default
    arguments (``group=group.WORLD``) of ``torch.distributed`` functions imported after the group
    was formed. The released DDP models no longer synchronise gradients: this is for exit.
    The groups' Python objects are dropped last, as their destructor runs with the GIL released so
    gloo's threads can finish freeing their work (the reducer's destructor keeps the GIL and would
    deadlock with them).

        release_process_groups()   # then the process may exit: gloo's threads are joined
    """
    import gc
    import sys

    from torch.nn.parallel import DistributedDataParallel

    group_type = dist.ProcessGroup
    groups: list[Any] = []
    if dist.is_initialized():
        groups.extend(dist.distributed_c10d._world.pg_map)
        dist.destroy_process_group()
    released = 0
    for obj in gc.get_objects():
        # type(), not isinstance(): a deprecated torch object warns when its __class__ is read
        if issubclass(type(obj), DistributedDataParallel) and "reducer" in obj.__dict__:
            groups.append(obj.__dict__.pop("process_group", None))
            for name in ("logger", "reducer"):  # the logger holds the reducer, the reducer the group
                obj.__dict__.pop(name, None)
            released += 1
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)  # None: a placeholder left by a failed import
        if name.startswith("torch.distributed") and isinstance(namespace, dict):
            groups.extend(_drop_group_defaults(namespace.values(), group_type))
    del groups  # the last references: the groups' destructors join gloo's threads here
    return released


def _drop_group_defaults(values: Any, group_type: type) -> list[Any]:
    """Default arguments that hold a process group (``def f(group=group.WORLD)``) become None (torch's "the
    default group"); returns the groups they held."""

    def is_group(value: Any) -> bool:  # type(), not isinstance(): deprecated torch objects warn on __class__
        return issubclass(type(value), group_type)

    held: list[Any] = []
    for value in list(values):
        functions = [value] if type(value) is types.FunctionType else []
        if issubclass(type(value), type):
            functions = [v for v in vars(value).values() if type(v) is types.FunctionType]
        for fn in functions:
            if fn.__defaults__ and any(map(is_group, fn.__defaults__)):
                held.extend(filter(is_group, fn.__defaults__))
                fn.__defaults__ = tuple(None if is_group(d) else d for d in fn.__defaults__)
            if fn.__kwdefaults__ and any(map(is_group, fn.__kwdefaults__.values())):
                held.extend(filter(is_group, fn.__kwdefaults__.values()))
                fn.__kwdefaults__ = {k: None if is_group(d) else d for k, d in fn.__kwdefaults__.items()}
    return held


def set_group_timeout(seconds: float) -> None:
    """Give the formed group its collective timeout (torch's private setter; present since 2.2)."""
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=seconds))


# keywords of PartialState beyond ``cpu``: the process-group options it honours
PROCESS_GROUP_KEYWORDS = ("backend", "timeout")


def check_state_keywords(owner: str, kwargs: dict[str, Any], accepted: tuple[str, ...]) -> None:
    """``TypeError`` for a keyword ``owner()`` (``PartialState``, ``AcceleratorState``) does not take."""
    if kwargs:
        name = sorted(kwargs)[0]
        raise TypeError(
            f"{owner}() got an unexpected keyword argument {name!r}; it accepts {', '.join(accepted)}. "
            "The rank, world size and address come from the launch environment (RANK, WORLD_SIZE, "
            "MASTER_ADDR, MASTER_PORT), not from keywords."
        )


def check_backend(backend: Any, use_cuda: bool) -> str | None:
    """``backend`` validated against what torch has built in and the device in use (None: the default)."""
    if backend is None:
        return None
    name = str(backend).strip().lower() if isinstance(backend, str) else backend
    if name not in _BACKENDS:
        raise ValueError(
            f"PartialState(backend={backend!r}) is not a process-group backend accel_nb can use; "
            f"choose one of {', '.join(map(repr, _BACKENDS))} (or leave it out: nccl on GPUs, gloo on CPU)"
        )
    if not _BACKENDS[name]():
        raise ValueError(f"backend={name!r} is not built into this torch; use 'gloo' (CPU) or 'nccl' (CUDA)")
    if name == "nccl" and not use_cuda:
        raise ValueError(
            "backend='nccl' needs CUDA GPUs but this process runs on the CPU; use backend='gloo' "
            "(or leave it out)"
        )
    return name


def timeout_seconds(timeout: Any) -> float | None:
    """A collective timeout as seconds: a number of seconds or a ``datetime.timedelta`` (None: the default)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"PartialState(timeout={timeout!r}): give seconds (a number) or a datetime.timedelta")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"PartialState(timeout={timeout!r}) must be a positive, finite number of seconds")
    return seconds


def rejoin_process_group(topo: dict[str, Any], backend: str, collective_timeout: float | None) -> None:
    """Leave a broken default group and form a fresh one from ``topo`` (same ranks, usually a new port).

    For a group whose links are already closed (a session's collective that was interrupted or
    failed): gloo's teardown is local, so leaving cannot hang on a peer. The old group lives on only
    in objects that still hold it (a DDP model's reducer): they are not re-bound here, see
    :func:`stale_group_holders`. Default arguments of ``torch.distributed`` functions that captured
    the old group fall back to the default group (the new one).

        rejoin_process_group(dict(read_topology(), master_port=port), "gloo", None)
    """
    import sys

    if dist.is_initialized():
        with contextlib.suppress(Exception):  # a half-broken group: what is left of it is abandoned
            dist.destroy_process_group()
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and module is not None:
            _drop_group_defaults(vars(module).values(), dist.ProcessGroup)
    join_process_group(topo, backend, collective_timeout)


def stale_group_holders(namespace: dict[str, Any]) -> list[str]:
    """The names in ``namespace`` (and in the lists, tuples and dicts at its top) bound to a group that is gone.

    A group is gone when torch no longer knows it (it was destroyed or replaced by
    :func:`rejoin_process_group`). Looked for: modules with a submodule that keeps such a group (a
    ``FullyShardedDataParallel`` wrapper, a ``DistributedDataParallel`` model over a subgroup), modules
    sharded by ``fully_shard`` over such a group, optimizers over the parameters of those modules,
    and process groups kept in variables. Each entry is ``"name (what)"``.
    """
    import torch

    live = {id(g) for g in dist.distributed_c10d._world.pg_map} if dist.is_initialized() else set()

    def gone(value: Any) -> bool:
        return issubclass(type(value), dist.ProcessGroup) and id(value) not in live

    def sharded_over_gone(module: Any) -> bool:  # fully_shard keeps its groups in its state, not the module
        state = module._get_fsdp_state() if callable(getattr(module, "_get_fsdp_state", None)) else None
        info = getattr(getattr(state, "_fsdp_param_group", None), "mesh_info", None)
        return any(gone(getattr(info, a, None)) for a in ("shard_process_group", "replicate_process_group"))

    def module_says(value: Any) -> str | None:
        kind = type(value).__name__
        for sub in value.modules():
            if any(gone(v) for v in vars(sub).values()):
                return f"{kind} wrapped with the old group"
            if sharded_over_gone(sub):
                return f"{kind} sharded over the old group"
        return None

    entries: list[tuple[str, Any]] = []
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, (list, tuple)):
            entries += [(f"{name}[{i}]", v) for i, v in enumerate(value[:100])]
        elif isinstance(value, dict):
            entries += [(f"{name}[{k!r}]", v) for k, v in list(value.items())[:100]]
        else:
            entries.append((name, value))
    found: list[str] = []
    stale_params: set[int] = set()
    optimizers: list[tuple[str, Any]] = []
    for label, item in entries:
        with contextlib.suppress(Exception):  # a user's object that cannot be looked into is left out
            if gone(item):
                found.append(f"{label} (a process group of the old group)")
            elif isinstance(item, torch.nn.Module):
                said = module_says(item)
                if said:
                    found.append(f"{label} ({said})")
                    stale_params.update(id(p) for p in item.parameters())
            elif isinstance(getattr(item, "param_groups", None), list):
                optimizers.append((label, item))
    for label, item in optimizers:
        with contextlib.suppress(Exception):
            params = [p for g in item.param_groups for p in g.get("params", ())]
            if any(id(p) in stale_params for p in params):
                found.append(
                    f"{label} ({type(item).__name__} over the parameters of a model bound to the old group)"
                )
    return found


def rebind_ddp_models() -> list[Any]:
    """Every ``DistributedDataParallel`` model of this process still bound to a gone group of the whole world gets the current one.

    Done as torch does when it unpickles a DDP model: the default group, a new reducer (and logger)
    over the same parameters, the model's communication hooks registered again (a hook state that
    was the old group becomes None: the default group). No collective is run: the replicas are not
    broadcast again. A model over a subgroup is left as it is (``stale_group_holders`` names it).
    Returns the models re-bound.
    """
    import gc
    import itertools

    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_initialized():
        return []
    live = {id(g) for g in dist.distributed_c10d._world.pg_map}
    world = dist.get_world_size()
    # DDP and its subclasses; type(), not isinstance(): a deprecated torch object warns when its
    # __class__ is read. The objects are filtered in C (compress/map): a Python loop over the
    # hundreds of thousands of objects of a process with torch took most of a regroup's time.
    kinds, todo = {DistributedDataParallel}, [DistributedDataParallel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in kinds:
                kinds.add(sub)
                todo.append(sub)
    objects = gc.get_objects()
    models = list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))
    del objects
    rebound = []
    for obj in models:
        if "reducer" not in obj.__dict__:
            continue
        old = obj.__dict__.get("process_group")
        if old is None or id(old) in live or old.size() != world:
            continue
        hooks = list(obj.__dict__.get("_comm_hooks", []))
        obj.__setstate__({})  # the default group and a new reducer; every other attribute is kept
        obj._comm_hooks = []
        for hook, state in hooks:
            obj.register_comm_hook(None if state is old else state, hook)
        rebound.append(obj)
    return rebound
