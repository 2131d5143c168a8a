"""Pick a free TCP port for the rendezvous, or check that the one the user gave is free.

port = pick_free_port("127.0.0.1")
ensure_port_free("127.0.0.1", 29500)   # LaunchSetupError when something listens there
"""

from __future__ import annotations

import socket

from .errors import LaunchSetupError

_LOCAL_ADDRS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", ""}


def _bind_host(addr: str) -> str:
    return "127.0.0.1" if addr in ("localhost", "") else addr


def pick_free_port(addr: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (asked from the OS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_bind_host(addr) if addr in _LOCAL_ADDRS else "", 0))
        return int(s.getsockname()[1])


def port_is_free(addr: str, port: int) -> bool:
    """True when a server could listen on ``addr:port`` (sockets in TIME_WAIT do not count as busy)."""
    host = _bind_host(addr) if addr in _LOCAL_ADDRS else ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return False
    return True


def ensure_port_free(addr: str, port: int) -> None:
    """Raise a clear ``LaunchSetupError`` when ``port`` (already checked to be 1..65535) is in use on this machine."""
    if not port_is_free(addr, port):
        raise LaunchSetupError(
            f"port {port} on {addr} is already in use (another launch or server listens there); "
            "pass another use_port=..., or use_port=None to let accel_nb pick a free one"
        )
