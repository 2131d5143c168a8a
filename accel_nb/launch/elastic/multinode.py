"""This machine's seat in a job of several machines, taken from a notebook: torchrun's rendezvous, no agent loop.

A notebook launch with ``num_nodes > 1`` does what torchrun's elastic agent does before and after
its ranks run — the rendezvous (static or c10d, with the same arguments ``accel-nb launch``
gives torch), the global ranks, the exit barrier — so its ranks join the same job as an
``accel-nb launch`` (or another notebook) on the other machines. The ranks themselves are
started and watched by the notebook launcher as usual.

    seat = MachineSeat(num_machines=2, machine_rank=1, nproc=2, addr="10.0.0.1", port=29500)
    seat.join()                  # blocks until every machine arrived (LaunchSetupError after the timeout)
    seat.rank_env(0)             # RANK=2, WORLD_SIZE=4, LOCAL_RANK=0, GROUP_RANK=1, MASTER_ADDR=..., ...
    seat.leave(succeeded=True)   # the exit barrier with the other machines' agents, then close
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from ...config import LAUNCHER_RDZV_BACKENDS
from ..errors import LaunchSetupError
from ..options import RDZV_BACKENDS_SAID, check_machine_options
from ..parent.process_launcher import ProcessLauncher
from .rendezvous import RUN_ID, agent_arguments, gloo_interface_env, rendezvous_failure

__all__ = ["MachineSeat", "NOTEBOOK_NAMES", "check_machine_options", "take_reference_options", "plan_seat"]

# the notebook_launcher arguments named in rendezvous errors
NOTEBOOK_NAMES = {
    "ip": "master_addr",
    "port": "use_port",
    "rank": "node_rank",
    "timeout": "rdzv_conf={'timeout': seconds}",
}


class MachineSeat:
    """The rendezvous of torchrun's agent for ``nproc`` local ranks of machine ``machine_rank``."""

    def __init__(
        self,
        num_machines: int,
        machine_rank: int,
        nproc: int,
        addr: str,
        port: int,
        backend: str = "static",
        timeout: float | None = None,
    ) -> None:
        if backend not in LAUNCHER_RDZV_BACKENDS:
            raise LaunchSetupError(f"rdzv_backend={backend!r} is not one of {RDZV_BACKENDS_SAID}")
        self.num_machines, self.machine_rank, self.nproc = num_machines, machine_rank, nproc
        self.addr, self.port, self.backend, self.timeout = addr, port, backend, timeout
        self._agent: Any = None

    def _make_agent(self) -> Any:
        """torch's agent, configured from the same arguments ``accel-nb launch`` passes (never run)."""
        from torch.distributed.elastic.agent.server.api import WorkerSpec
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.rendezvous import RendezvousParameters, registry
        from torch.distributed.launcher.api import _get_addr_and_port
        from torch.distributed.run import config_from_args, parse_args

        args = agent_arguments(
            self.num_machines, self.machine_rank, self.nproc, self.backend, self.addr, self.port, self.timeout
        )
        config, _, _ = config_from_args(parse_args([*args, "accel_nb_notebook_ranks"]))
        params = RendezvousParameters(
            backend=config.rdzv_backend,
            endpoint=config.rdzv_endpoint,
            run_id=RUN_ID,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            local_addr=config.local_addr,
            **config.rdzv_configs,
        )
        master_addr, master_port = _get_addr_and_port(params)
        spec = WorkerSpec(
            role=config.role,
            local_world_size=self.nproc,
            entrypoint="python",
            args=(),
            rdzv_handler=registry.get_rendezvous_handler(params),
            max_restarts=0,
            monitor_interval=config.monitor_interval,
            master_addr=master_addr,
            master_port=master_port,
            local_addr=config.local_addr,
        )
        return LocalElasticAgent(spec=spec, logs_specs=config.logs_specs, start_method="fork")

    def join(self) -> None:
        """Meet the other machines; ``LaunchSetupError`` naming the endpoint when one never comes."""
        agent = self._make_agent()
        # torch's C++ store prints every failed connect try with a C++ stack to fd 2, which a kernel
        # shows in the cell above our one-line error: it goes to a file, named when the join fails
        fd, torch_log = tempfile.mkstemp(prefix="accel_nb-rendezvous-", suffix=".log")
        try:
            with _fd2_to(fd):
                agent._rendezvous(agent._worker_group)  # torch's own rendezvous and rank assignment
        except Exception as exc:
            said = rendezvous_failure(
                exc, self.num_machines, self.machine_rank, self.addr, self.port, self.timeout, NOTEBOOK_NAMES
            )
            if said is None:
                raise
            if os.path.getsize(torch_log):
                said += f" (torch's own messages: {torch_log})"
            raise LaunchSetupError(said) from None
        finally:
            os.close(fd)
        os.unlink(torch_log)  # joined: its retry messages are noise
        self._agent = agent

    def rank_env(self, local_rank: int) -> dict[str, str]:
        """The torchrun environment of local rank ``local_rank`` (its global rank from the rendezvous)."""
        group = self._agent._worker_group
        worker = group.workers[local_rank]
        spec = group.spec
        return {
            "RANK": str(worker.global_rank),
            "WORLD_SIZE": str(worker.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "GROUP_RANK": str(group.group_rank),
            "GROUP_WORLD_SIZE": str(group.group_world_size),
            "NODE_RANK": str(group.group_rank),
            "ROLE_RANK": str(worker.role_rank),
            "ROLE_NAME": spec.role,
            "ROLE_WORLD_SIZE": str(worker.role_world_size),
            "MASTER_ADDR": str(group.master_addr),
            "MASTER_PORT": str(group.master_port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
            "TORCHELASTIC_USE_AGENT_STORE": str(spec.rdzv_handler.use_agent_store),
            **gloo_interface_env(self.addr),
        }

    def describe(self) -> str:
        """``machine 1 of 2, static rendezvous at 10.0.0.1:29500``."""
        return (
            f"machine {self.machine_rank} of {self.num_machines}, {self.backend} rendezvous at "
            f"{self.addr}:{self.port}"
        )

    @property
    def global_ranks(self) -> list[int]:
        """The global rank of each local rank."""
        return [w.global_rank for w in self._agent._worker_group.workers]

    def leave(self, succeeded: bool) -> None:
        """After the local ranks: the agents' exit barrier when they succeeded (as torchrun), then close."""
        agent, self._agent = self._agent, None
        if agent is None:
            return
        try:
            if succeeded:
                agent._exit_barrier()  # logs and returns when another machine failed
        finally:
            agent._worker_group.spec.rdzv_handler.shutdown()


class MultiNodeLauncher(ProcessLauncher):
    """This machine's rank processes in a job of several machines: join the rendezvous first, leave it after."""

    def __init__(self, seat: MachineSeat) -> None:
        self.seat = seat

    def prepare(self, plan: Any, say: Callable[[str], None]) -> None:
        say(f"[accel_nb] {self.seat.describe()}: waiting for every machine...")
        self.seat.join()
        say(f"[accel_nb] this machine runs global ranks {', '.join(map(str, self.seat.global_ranks))}")

    def extra_env(self, plan: Any, rank: int) -> dict[str, str]:
        return self.seat.rank_env(rank)  # global ranks, world size and store from the machines' rendezvous

    def release(self, plan: Any, ok: bool) -> None:
        self.seat.leave(succeeded=ok)

    def session_problem(self, plan: Any) -> str | None:
        return (
            f"a session runs on this machine only, and num_nodes={plan.options.num_nodes} asks for a job of "
            "several machines: launch each cell with %%accelerate or notebook_launcher on every machine, or "
            "hold a session here with num_nodes=1"
        )


def take_reference_options(options: dict[str, Any]) -> None:
    """The reference's ``rdzv_conf={"timeout": s}`` (or ``join_timeout``) becomes ``rdzv_timeout``, in place."""
    conf = options.pop("rdzv_conf", None)
    if not conf:
        return
    if not isinstance(conf, dict) or set(conf) - {"timeout", "join_timeout"}:
        raise LaunchSetupError(
            f"rdzv_conf={conf!r}: a notebook launch reads only 'timeout' (or 'join_timeout'), the seconds to "
            "wait for the other machines; run `accel-nb launch` for other rendezvous settings"
        )
    options["rdzv_timeout"] = float(conf.get("timeout", conf.get("join_timeout")))


def plan_seat(options: Any, nproc: int) -> MachineSeat:
    """This machine's seat for a launch of ``options.num_nodes`` machines (checked, not joined yet).

    The port is ``use_port`` (29500 when None, as ``accel-nb launch``); machine 0 must own
    ``master_addr`` and find the port free.
    """
    from .rendezvous import DEFAULT_PORT, endpoint_problem

    port = options.use_port or DEFAULT_PORT
    problem = endpoint_problem(options.num_nodes, options.node_rank, options.master_addr, port)
    if problem is not None:
        which, reason = problem
        fix = (
            "give machine 0's address as master_addr="
            if which == "ip"
            else "pick another use_port=, the same on every machine"
        )
        value = options.master_addr if which == "ip" else port
        raise LaunchSetupError(f"{NOTEBOOK_NAMES[which]}={value!r}: {reason}; {fix}")
    _warn_if_loopback(options.master_addr, options.num_nodes)
    return MachineSeat(
        options.num_nodes,
        options.node_rank,
        nproc,
        options.master_addr,
        port,
        options.rdzv_backend,
        options.rdzv_timeout,
    )


def _warn_if_loopback(addr: str, num_nodes: int) -> None:
    """Warn when ``num_nodes > 1`` machines are told to meet at a loopback address (e.g. the default 127.0.0.1).

    Only processes on this machine reach such an address, so the other machines would wait until the
    rendezvous times out; it is right only for "machines" that share one host (a test), hence a warning.
    """
    try:
        loopback = ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):  # unresolvable: endpoint_problem already said so
        return
    if loopback:
        warnings.warn(
            f"master_addr={addr!r} is a loopback address, but num_nodes={num_nodes}: machines other than "
            "this one cannot reach it and would wait for the rendezvous timeout; give machine 0's address "
            "that every machine reaches as master_addr= (the same on every machine)",
            stacklevel=4,
        )


@contextlib.contextmanager
def _fd2_to(fd: int) -> Iterator[None]:
    """File descriptor 2 (what C/C++ code writes as stderr) goes to ``fd`` inside the block; Python's
    ``sys.stderr`` in a kernel is not fd 2 and still reaches the cell."""
    with contextlib.suppress(Exception):  # a closed or broken stream: nothing to flush
        sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
