"""A re-formed session group: the ranks other than 0 wait for rank 0's new store to listen (read from /proc).

``wait_for_listener`` makes no connection (a connection to a ``TCPStore`` is a client of it); it reads
the listening sockets of this network namespace. Where /proc cannot tell, it does not wait.
"""

from __future__ import annotations

import os
import socket

import pytest

from accel_nb.launch.session.loop import listening_ports, wait_for_listener

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/net/tcp"), reason="reads /proc/net/tcp (Linux)"
)


def test_a_listening_port_is_seen_and_a_closed_one_is_not():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert port not in listening_ports()  # bound, not yet listening: a store that is not ready
    assert wait_for_listener(port, within=0) is False
    server.listen()
    try:
        assert port in listening_ports()
        assert wait_for_listener(port, within=0) is True
        client = socket.create_connection(("127.0.0.1", port))  # an established link is not a listener
        peer, _ = server.accept()
        assert client.getsockname()[1] not in listening_ports()
        client.close()
        peer.close()
    finally:
        server.close()
