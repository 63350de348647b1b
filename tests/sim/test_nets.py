"""Choosing the simulator's loopback net: a net whose old ports linger in TIME_WAIT (right after
`sim down`) is reused; a net where something listens is not."""

from __future__ import annotations

import os
import socket

import pytest

from orchestrator_sim.fleet import SGLANG_PORT, SimError, _addr_free, choose_net


def _time_wait(address: str, port: int = 0) -> int:
    """A port of `address` whose server side is left in TIME_WAIT, nothing listening."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(1)
    port = server.getsockname()[1]
    client = socket.create_connection((address, port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    return port


def test_a_port_in_time_wait_is_free_but_a_listening_one_is_not() -> None:
    port = _time_wait("127.0.250.1")
    plain = socket.socket()
    with pytest.raises(OSError):  # what the probe met before: EADDRINUSE from TIME_WAIT
        plain.bind(("127.0.250.1", port))
    plain.close()
    assert _addr_free("127.0.250.1", port)
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.250.1", port))
        busy.listen(1)
        assert not _addr_free("127.0.250.1", port)


def test_choose_net_reuses_a_net_after_sim_down() -> None:
    # the SGLang port of the net's first host lingers in TIME_WAIT, as after `sim down`
    _time_wait("127.0.251.1", SGLANG_PORT)
    net, fd = choose_net("127.0.251")
    os.close(fd)
    assert net == "127.0.251"
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.251.1", SGLANG_PORT))
        busy.listen(1)
        with pytest.raises(SimError, match="no free loopback net"):
            choose_net("127.0.251")
