"""Who listens on a port: the agent asks the kernel's sock_diag netlink (LISTEN sockets only,
no walk of the established hash) and reads /proc/net/tcp and tcp6 where that is refused. Both
sources are asked here about real loopback sockets and must name the same sockets, by the
inodes the sockets really have."""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from orchestrator.remote import server


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@contextmanager
def listening(*addresses: str) -> Iterator[tuple[int, dict[str, int]]]:
    """Sockets listening on one free port at each address; yields (port, {address: inode})."""
    with ExitStack() as stack:
        port, inodes = 0, {}
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            s = stack.enter_context(socket.socket(family))
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((address, port))
            s.listen()
            port = s.getsockname()[1]
            inodes[address] = os.fstat(s.fileno()).st_ino
        yield port, inodes


def _by_address(found: list[dict]) -> dict[str, int]:
    return {s["address"]: s["inode"] for s in found}


@pytest.mark.parametrize("via", ["netlink", "proc"])
def test_each_source_names_the_listening_sockets_by_inode(via: str) -> None:
    addresses = ["127.0.0.1", "127.0.0.2"] + (["::1"] if _ipv6_loopback() else [])
    with listening(*addresses) as (port, inodes):
        # a connection to the port is an ESTABLISHED socket on it, not a listener
        with socket.create_connection(("127.0.0.1", port)):
            assert _by_address(server.listening_sockets(port, via)) == inodes
        with listening("127.0.0.1") as (other, other_inodes):
            assert other != port
            assert _by_address(server.listening_sockets(other, via)) == other_inodes
    assert server.listening_sockets(port, via) == []


def test_the_default_source_agrees_with_proc_net_tcp() -> None:
    with listening("127.0.0.1", "127.0.0.3") as (port, inodes):
        default = server.listening_sockets(port)
        assert sorted(map(str, default)) == sorted(map(str, server.listening_sockets(port,
                                                                                     "proc")))
        assert _by_address(default) == inodes


def test_a_dual_stack_listener_is_reported_as_ipv6_by_both() -> None:
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    with socket.socket(socket.AF_INET6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        s.listen()
        port = s.getsockname()[1]
        want = [{"address": "::", "inode": os.fstat(s.fileno()).st_ino}]
        assert server.listening_sockets(port, "netlink") == want
        assert server.listening_sockets(port, "proc") == want


def _nlmsg(kind: int, payload: bytes, flags: int = 0x2) -> bytes:
    """One netlink message (struct nlmsghdr, then PAYLOAD, padded to 4 bytes)."""
    body = struct.pack("=IHHII", 16 + len(payload), kind, flags, 1, 0) + payload
    return body + bytes(-len(body) % 4)


def _listener(port: int, inode: int, state: int = 10) -> bytes:
    """struct inet_diag_msg of a 127.0.0.1:PORT socket (inet_diag.h:117-130)."""
    src = socket.inet_aton("127.0.0.1") + bytes(12)  # idiag_src[4]
    sockid = struct.pack(">HH", port, 0) + src + bytes(16) + bytes(4) + bytes(8)  # dst, if, cookie
    return struct.pack("=BBBB", socket.AF_INET, state, 0, 0) + sockid + struct.pack(
        "=IIIII", 0, 0, 0, 0, inode)


def test_a_dump_that_ends_in_error_or_was_cut_is_not_taken_for_a_whole_answer() -> None:
    done = _nlmsg(3, struct.pack("=i", 0))
    found: list[dict] = []
    data = _nlmsg(20, _listener(8080, 77)) + _nlmsg(20, _listener(8080, 78, state=1)) + _nlmsg(
        20, _listener(9090, 79))
    assert server._diag_parse(data, 8080, found) is False  # no DONE yet: read on
    assert server._diag_parse(done, 8080, found) is True
    assert found == [{"address": "127.0.0.1", "inode": 77}]  # ESTABLISHED and 9090 left out
    for bad in (_nlmsg(3, struct.pack("=i", -errno.EINTR)),  # DONE carrying an errno
                _nlmsg(2, struct.pack("=i", -errno.ENOENT) + bytes(16)),  # no inet_diag
                _nlmsg(20, _listener(8080, 80), flags=0x2 | 0x10)):  # NLM_F_DUMP_INTR
        with pytest.raises(OSError):
            server._diag_parse(bad, 8080, [])
