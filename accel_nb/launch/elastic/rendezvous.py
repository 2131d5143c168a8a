"""Several machines through torch.distributed's elastic agent: the rendezvous, its checks and its errors.

``accel-nb launch`` asks torchrun's engine for the job; this module says how machines meet
(static or c10d rendezvous at ``main_process_ip:main_process_port``, machine 0 hosting the
store), checks what can be checked before anything starts, and turns a rendezvous that never
completes into one line that names the endpoint.

    addr, port = main_endpoint(cfg)
    check_endpoint(cfg, addr, port)          # ConfigError: busy port, not this machine's address
    args = agent_arguments(2, 1, 4, "c10d", addr, port, timeout=60)
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from ...config import ConfigError
from ..ports import pick_free_port, port_is_free

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_RDZV_TIMEOUT",
    "main_endpoint",
    "CLI_NAMES",
    "endpoint_problem",
    "check_endpoint",
    "RUN_ID",
    "agent_arguments",
    "machine_label_template",
    "rendezvous_failure",
    "address_toward",
    "interface_toward",
    "gloo_interface_env",
]

DEFAULT_PORT = 29500  # across machines, as torchrun
DEFAULT_RDZV_TIMEOUT = 600  # seconds, torch's default for both rendezvous backends


def main_endpoint(cfg: Any) -> tuple[str, int]:
    """Where the machines meet: the main machine's address and port (a free port on one machine)."""
    addr = cfg.main_process_ip or "127.0.0.1"
    if cfg.main_process_port:
        return addr, int(cfg.main_process_port)
    return addr, pick_free_port(addr) if cfg.num_machines == 1 else DEFAULT_PORT


CLI_NAMES = {
    "ip": "--main_process_ip",
    "port": "--main_process_port",
    "rank": "--machine_rank",
    "timeout": "--rdzv_timeout",
}


def endpoint_problem(
    num_machines: int, machine_rank: int, addr: str, port: int, port_given: bool = True
) -> tuple[str, str] | None:
    """What stops machine ``machine_rank`` from using ``addr:port``, as ``("ip"|"port", reason)``; None if fine.

    Machine 0 must own ``addr`` and find ``port`` free; the others must resolve ``addr``. On one
    machine only a port the user gave (``port_given``) is checked.
    """
    if num_machines == 1:
        if port_given and not port_is_free(addr, port):
            return "port", f"port {port} is already in use (another launch or a server listens there)"
        return None
    try:
        ip = socket.gethostbyname(addr)
    except OSError as exc:
        return "ip", f"cannot resolve {addr!r} ({exc})"
    if machine_rank != 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            return "ip", (
                f"{ip} is not an address of this machine, but machine 0 hosts the rendezvous there; "
                "start machine 0 on the machine that has that address"
            )
    if not port_is_free(ip, port):
        return "port", f"port {port} on {addr} is already in use (another launch or a server listens there)"
    return None


def check_endpoint(cfg: Any, addr: str, port: int) -> None:
    """``endpoint_problem`` for ``accel-nb launch``: a ``ConfigError`` naming the flag and the fix."""
    problem = endpoint_problem(cfg.num_machines, cfg.machine_rank, addr, port, bool(cfg.main_process_port))
    if problem is None:
        return
    which, reason = problem
    if which == "ip":
        raise ConfigError(
            CLI_NAMES["ip"], addr, "an address of machine 0 that every machine reaches", None, reason
        )
    fix = (
        "pick another, the same on every machine"
        if cfg.num_machines > 1
        else "pick another or leave the flag out to get a free one"
    )
    raise ConfigError(CLI_NAMES["port"], port, "a free port on the main machine", None, f"{reason}; {fix}")


RUN_ID = "accel_nb"  # the rendezvous id of every accel_nb job (the CLI's and a notebook's agree)


def agent_arguments(
    num_machines: int,
    machine_rank: int,
    nproc: int,
    backend: str,
    addr: str,
    port: int,
    timeout: float | None = None,
    max_restarts: int = 0,
) -> list[str]:
    """torchrun's flags for this machine's agent: machines, processes here, restarts, rendezvous.

    agent_arguments(2, 1, 4, "static", "10.0.0.1", 29500)   # ["--nnodes", "2", "--node_rank", "1", ...]
    """
    args = ["--nnodes", str(num_machines), "--node_rank", str(machine_rank)]
    args += ["--nproc_per_node", str(nproc), "--max_restarts", str(max_restarts)]
    seconds = max(1, round(timeout if timeout is not None else DEFAULT_RDZV_TIMEOUT))
    if backend == "static":
        args += ["--master_addr", addr, "--master_port", str(port)]
        return args + ["--rdzv_id", RUN_ID, "--rdzv_conf", f"timeout={seconds}"]
    conf = f"join_timeout={seconds}"
    if backend == "c10d":
        # the store lives on machine 0 (torch's own guess compares host names, which fails behind NAT
        # or in a network namespace); its connection timeout is the same
        conf += f",is_host={int(machine_rank == 0)},read_timeout={seconds}"
    args += [
        "--rdzv_backend",
        backend,
        "--rdzv_endpoint",
        f"{addr}:{port}",
        "--rdzv_id",
        RUN_ID,
        "--rdzv_conf",
        conf,
    ]
    local = address_toward(addr) if num_machines > 1 else None
    if local:
        # the ranks meet at the address machine 0 announces; torch's default (the host name) may
        # resolve to a loopback address on that machine
        args += ["--local_addr", local]
    return args


def machine_label_template(machine_rank: int) -> str:
    """torchrun's log-line prefix that names the machine and the global rank: ``[machine1 rank3]:``."""
    return f"[machine{machine_rank} rank${{rank}}]:"


def address_toward(addr: str) -> str | None:
    """This machine's own IP address on the route to ``addr`` (``addr`` itself on machine 0)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(addr), DEFAULT_PORT))  # UDP: no packet is sent
            return str(s.getsockname()[0])
    except OSError:
        return None


def interface_toward(addr: str) -> str | None:
    """The network interface this machine uses to reach ``addr`` (its own interface on machine 0).

    gloo binds the address its host name resolves to, which is often a loopback or a private one
    the other machines cannot reach; ``GLOO_SOCKET_IFNAME`` set to this interface avoids that.
    """
    import psutil

    local = address_toward(addr)
    for name, addrs in psutil.net_if_addrs().items():
        if local and any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    return None


def gloo_interface_env(main_ip: str) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` for the ranks of a machine of several: the interface that reaches ``main_ip``.

    Empty when the user already set it (or no interface is found).
    """
    import os

    if "GLOO_SOCKET_IFNAME" in os.environ:
        return {}
    interface = interface_toward(main_ip)
    return {"GLOO_SOCKET_IFNAME": interface} if interface else {}


_TIMEOUT_WORDS = ("timed out", "timeout", "time out")
_CONNECT_WORDS = ("connect", "connection refused", "no route", "unreachable")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return seen


def rendezvous_failure(
    exc: BaseException,
    num_machines: int,
    machine_rank: int,
    addr: str,
    port: int,
    timeout: float | None,
    names: dict[str, str] = CLI_NAMES,
) -> str | None:
    """One line for a rendezvous that did not complete (a machine never came), or None for other errors.

    ``names`` are the face's names of the rank and timeout options (the CLI's flags by default).
    """
    chain = _chain(exc)
    kinds = " ".join(type(e).__name__ for e in chain)
    text = " ".join(str(e) for e in chain).lower()
    if "Rendezvous" not in kinds and "DistStoreError" not in kinds and "DistNetworkError" not in kinds:
        if not any(w in text for w in _TIMEOUT_WORDS):
            return None
    seconds = round(timeout if timeout is not None else DEFAULT_RDZV_TIMEOUT)
    where = f"{addr}:{port}"
    wait = f"or wait longer with {names['timeout']}"
    if num_machines == 1:
        return f"the rendezvous at {where} did not complete within {seconds}s ({type(exc).__name__}: {exc})"
    if machine_rank == 0:
        others = ", ".join(str(r) for r in range(1, num_machines))
        return (
            f"the other machine(s) did not join the rendezvous at {where} within {seconds}s: start them "
            f"with {names['rank']} {others}, check that they reach {where} (address, firewall), {wait}"
        )
    if any(w in text for w in _CONNECT_WORDS + _TIMEOUT_WORDS):
        return (
            f"could not join the main machine at {where} within {seconds}s: start machine 0 "
            f"({names['rank']} 0) on the machine with address {addr}, check that this machine reaches "
            f"{where} (address, firewall), {wait}"
        )
    return None
