"""SSH failure modes against a real sshd: drops, outages, vanished hosts, bad credentials."""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.errors import (
    AuthError,
    ConnectError,
    ConnectionLost,
    TransientConnectError,
    TransportError,
)
from orchestrator.transports import SSHTransport
from tests.sshd import SSHServer, pids_matching, wait_until
from tests.transports.helpers import Background, gone, unique_sleep_arg


def _transport(closing: list[SSHTransport], spec: Any, **kw: Any) -> SSHTransport:
    t = SSHTransport(spec, **kw)
    closing.append(t)
    return t


def test_sshd_killed_mid_command_then_same_transport_reconnects(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    t = _transport(closing, ssh_server.host_spec(), retry_initial=0.2, retry_max=0.5)
    t.connect()
    arg = unique_sleep_arg()
    bg = Background(lambda: t.run(f"sleep {arg}"))
    assert wait_until(lambda: pids_matching(f"sleep {arg}"), 5)
    killed_at = time.monotonic()
    ssh_server.stop()  # sshd and its session processes die, like a crash or reboot
    bg.join(10)
    assert isinstance(bg.error, ConnectionLost), bg.error
    assert time.monotonic() - killed_at < 15  # promptly, not after the 30 s heartbeat limit
    assert "not re-run" not in str(bg.error) and "connection lost" in str(bg.error)
    assert gone(f"sleep {arg}")  # the agent saw EOF and killed the command's group
    ssh_server.restart()
    r = t.run("echo back")  # same transport: reconnects first, does not re-run the sleep
    assert r.stdout == "back\n"
    assert pids_matching(f"sleep {arg}") == []


def test_connect_waits_for_sshd_to_come_back(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    waits: list[tuple[int, float, BaseException]] = []
    t = _transport(closing, ssh_server.host_spec(), retry_initial=0.2, retry_max=0.5,
                   on_wait=lambda n, elapsed, err: waits.append((n, elapsed, err)))
    ssh_server.stop()
    restarter = threading.Timer(1.5, ssh_server.start)
    restarter.start()
    start = time.monotonic()
    try:
        with capture_logs() as logs:
            t.connect(budget=15)
    finally:
        restarter.join()
    assert 1.4 < time.monotonic() - start < 30
    assert t.run("echo up").stdout == "up\n"
    assert waits and all(isinstance(e, TransientConnectError) for _, _, e in waits)
    assert [n for n, _, _ in waits] == list(range(1, len(waits) + 1))
    assert "connection refused" in str(waits[0][2])
    events = [e for e in logs if e["event"] == "waiting for host"]
    assert len(events) == len(waits)
    assert {"attempt", "elapsed", "error", "host"} <= set(events[0])


def test_connect_gives_up_after_budget(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    slept: list[float] = []

    def fake_sleep(seconds: float) -> None:  # injectable sleep: no real waiting
        slept.append(seconds)
        time.sleep(min(seconds, 0.05))

    ssh_server.stop()
    t = _transport(closing, ssh_server.host_spec(), sleep=fake_sleep, retry_initial=0.1,
                   retry_max=0.2)
    start = time.monotonic()
    with pytest.raises(TransientConnectError) as info:
        t.connect(budget=0.6)
    assert time.monotonic() - start < 15
    assert len(slept) >= 2 and max(slept) <= 0.6 + 1e-6
    assert "gave up after" in str(info.value) and "connection refused" in str(info.value)
    assert info.value.hint


def test_close_interrupts_a_waiting_connect(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    ssh_server.stop()
    t = _transport(closing, ssh_server.host_spec(), retry_initial=2, retry_max=5)
    bg = Background(lambda: t.connect(budget=60))
    time.sleep(0.5)  # first attempt refused; now sleeping before the next
    start = time.monotonic()
    t.close()
    bg.join(10)
    assert time.monotonic() - start < 10  # not the remaining ~60 s budget
    assert isinstance(bg.error, TransportError) and "closed" in str(bg.error)


def test_vanished_host_is_detected_by_missing_heartbeats(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    t = _transport(closing, ssh_server.host_spec(), heartbeat=0.2, heartbeat_misses=5)
    t.connect()
    arg = unique_sleep_arg()
    bg = Background(lambda: t.run(f"sleep {arg}"))
    assert wait_until(lambda: pids_matching(f"sleep {arg}"), 5)
    frozen = ssh_server.signal_sessions(signal.SIGSTOP)  # TCP stays up, nothing answers
    assert frozen
    try:
        start = time.monotonic()
        bg.join(10)
        assert isinstance(bg.error, ConnectionLost), bg.error
        assert time.monotonic() - start < 20  # ~1 s of silence, not TCP's 15 minutes
        assert "no message from the host" in str(bg.error)
    finally:
        ssh_server.signal_sessions(signal.SIGCONT)
    assert gone(f"sleep {arg}")  # once sshd runs again it notices and the agent cleans up


def test_idle_drop_is_repaired_transparently_for_file_ops(
    ssh_server: SSHServer, closing: list[SSHTransport], tmp_path: Any
) -> None:
    t = _transport(closing, ssh_server.host_spec())
    t.connect()
    first_pid = t.agent_info["pid"]
    ssh_server.restart()
    assert wait_until(lambda: not t.connected, 5)
    (tmp_path / "f").write_bytes(b"data")
    assert t.read_file(str(tmp_path / "f")) == b"data"
    assert t.agent_info["pid"] != first_pid


def test_auth_failure_is_not_retried(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    waits: list[int] = []
    other_key = ssh_server.factory.new_client_key("unauthorized")
    t = _transport(closing, ssh_server.host_spec(identity_file=other_key),
                   on_wait=lambda n, e, err: waits.append(n))
    start = time.monotonic()
    with pytest.raises(AuthError) as info:
        t.connect(budget=30)
    assert time.monotonic() - start < 15 and waits == []  # budget was 30 s
    assert other_key in str(info.value) and ssh_server.user in str(info.value)
    assert "authorized_keys" in (info.value.hint or "")


def test_missing_identity_file_is_a_clear_error(
    ssh_server: SSHServer, closing: list[SSHTransport], tmp_path: Any
) -> None:
    t = _transport(closing, ssh_server.host_spec(identity_file=str(tmp_path / "nokey")))
    with pytest.raises(ConnectError, match="identity file .*nokey does not exist"):
        t.connect(budget=30)


def test_missing_python_on_host_is_not_retried(
    ssh_server: SSHServer, closing: list[SSHTransport]
) -> None:
    t = _transport(closing, ssh_server.host_spec(), python="python3-surely-missing")
    start = time.monotonic()
    with pytest.raises(ConnectError) as info:
        t.connect(budget=30)
    assert not isinstance(info.value, TransientConnectError)
    assert time.monotonic() - start < 15  # not retried for the 30 s budget
    assert "python3 was not found" in str(info.value) and "Python 3.8" in (info.value.hint or "")


def test_non_ssh_server_is_transient_and_prints_no_traceback(
    closing: list[SSHTransport], capfd: pytest.CaptureFixture[str], sshd: Any
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(3):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    server = sshd()
    spec = server.host_spec(port=port, connect_timeout=2)
    t = _transport(closing, spec)
    try:
        with pytest.raises(TransientConnectError):
            t.connect(budget=0)
    finally:
        listener.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
