"""Several machines through torch.distributed's elastic agent: the rendezvous, its checks and its errors.

``accel-nb launch`` asks torchrun's engine for the job; this module says how machines meet
(static or c10d rendezvous at ``main_process_ip:main_process_port``, machine 0 hosting the
store), checks what can be checked before anything starts, and turns a rendezvous that never
completes into one line that names the endpoint.

    addr, port = main_endpoint(cfg)
    check_endpoint(cfg, addr, port)          # ConfigError: busy port, not this machine's address
    args = rendezvous_arguments(cfg, addr, port, timeout=60)
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from .config_values import ConfigError
from .launch.ports import pick_free_port, port_is_free

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_RDZV_TIMEOUT",
    "main_endpoint",
    "check_endpoint",
    "rendezvous_arguments",
    "machine_label_template",
    "rendezvous_failure",
    "address_toward",
    "interface_toward",
]

DEFAULT_PORT = 29500  # across machines, as torchrun
DEFAULT_RDZV_TIMEOUT = 600  # seconds, torch's default for both rendezvous backends


def main_endpoint(cfg: Any) -> tuple[str, int]:
    """Where the machines meet: the main machine's address and port (a free port on one machine)."""
    addr = cfg.main_process_ip or "127.0.0.1"
    if cfg.main_process_port:
        return addr, int(cfg.main_process_port)
    return addr, pick_free_port(addr) if cfg.num_machines == 1 else DEFAULT_PORT


def _resolve(addr: str) -> str:
    try:
        return socket.gethostbyname(addr)
    except OSError as exc:
        raise ConfigError("--main_process_ip", addr, "an IP address or a host name this machine can resolve",
                          None, f"cannot resolve it ({exc})") from None  # fmt: skip


def check_endpoint(cfg: Any, addr: str, port: int) -> None:
    """Before starting: machine 0 must own ``addr`` and find ``port`` free; others must resolve ``addr``.

    Raises ``ConfigError`` naming the flag and the fix. On one machine only a port the user gave is checked.
    """
    if cfg.num_machines == 1:
        if cfg.main_process_port and not port_is_free(addr, port):
            raise ConfigError("--main_process_port", port, "a free port on this machine", None,
                              f"port {port} is already in use (another launch or a server listens there); "
                              "pick another or leave the flag out to get a free one")  # fmt: skip
        return
    ip = _resolve(addr)
    if cfg.machine_rank != 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            raise ConfigError("--main_process_ip", addr, "an address of this machine when --machine_rank is 0",
                              None, f"{ip} is not an address of this machine, but machine 0 hosts the "
                              "rendezvous there; run machine 0's command on the machine that has that "
                              "address") from None  # fmt: skip
    if not port_is_free(ip, port):
        raise ConfigError("--main_process_port", port, "a free port on the main machine", None,
                          f"port {port} on {addr} is already in use (another launch or a server listens "
                          "there); pick another, the same on every machine")  # fmt: skip


def rendezvous_arguments(cfg: Any, addr: str, port: int, timeout: float | None = None) -> list[str]:
    """torchrun's flags for the rendezvous: static (``--master_addr``) or c10d (machine 0 hosts the store)."""
    seconds = max(1, round(timeout if timeout is not None else DEFAULT_RDZV_TIMEOUT))
    if cfg.rdzv_backend == "static":
        args = ["--master_addr", addr, "--master_port", str(port)]
        return args + ["--rdzv_conf", f"timeout={seconds}"]
    conf = f"join_timeout={seconds}"
    if cfg.rdzv_backend == "c10d":
        # the store lives on machine 0 (torch's own guess compares host names, which fails behind NAT
        # or in a network namespace); its connection timeout is the same
        conf += f",is_host={int(cfg.machine_rank == 0)},read_timeout={seconds}"
    args = ["--rdzv_backend", cfg.rdzv_backend, "--rdzv_endpoint", f"{addr}:{port}",
            "--rdzv_id", "accel_nb", "--rdzv_conf", conf]  # fmt: skip
    local = address_toward(addr) if cfg.num_machines > 1 else None
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


_TIMEOUT_WORDS = ("timed out", "timeout", "time out")
_CONNECT_WORDS = ("connect", "connection refused", "no route", "unreachable")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return seen


def rendezvous_failure(exc: BaseException, cfg: Any, addr: str, port: int, timeout: float | None) -> str | None:
    """One line for a rendezvous that did not complete (a machine never came), or None for other errors."""
    chain = _chain(exc)
    names = " ".join(type(e).__name__ for e in chain)
    text = " ".join(str(e) for e in chain).lower()
    if "Rendezvous" not in names and "DistStoreError" not in names and "DistNetworkError" not in names:
        if not any(w in text for w in _TIMEOUT_WORDS):
            return None
    seconds = round(timeout if timeout is not None else DEFAULT_RDZV_TIMEOUT)
    where = f"{addr}:{port}"
    others = ", ".join(str(r) for r in range(1, cfg.num_machines))
    if cfg.num_machines == 1:
        return f"the rendezvous at {where} did not complete within {seconds}s ({type(exc).__name__}: {exc})"
    if cfg.machine_rank == 0:
        return (
            f"the other machine(s) did not join the rendezvous at {where} within {seconds}s "
            f"(--rdzv_timeout): start the same command with --machine_rank {others} on them, check that "
            f"they reach {where} (address, firewall), or wait longer with --rdzv_timeout"
        )
    if any(w in text for w in _CONNECT_WORDS + _TIMEOUT_WORDS):
        return (
            f"could not join the main machine at {where} within {seconds}s (--rdzv_timeout): start "
            f"--machine_rank 0 on the machine with address {addr}, check that this machine reaches "
            f"{where} (address, firewall), or wait longer with --rdzv_timeout"
        )
    return None
