"""The service commands are table-driven (orchestrator.service.SERVICE_KINDS): a gateway host
is found by its group, its supervised process shows as running (not stopped) while it serves,
restarting while its supervisor brings it back, its log is shown and `stop` stops it.

The process is a tiny HTTP server under the real supervisor (`PYTHON supervise.py
launch.json`, started by the real `server_start` action over a `connection: local` host),
standing in for the gateway until the gateway stage lands: only its /health is asked here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from orchestrator import service
from orchestrator.cli.service_cmds import add_subcommands
from orchestrator.config.model import HostSpec
from orchestrator.host import Host
from orchestrator.transports.local import LocalTransport

CP_KEY = "cp-service-canary-0f3a"

SERVE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == '/health' else 404)
        self.end_headers()
    def log_message(self, *a):
        print('GET', self.path, flush=True)
print('gateway up on', sys.argv[1], flush=True)
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(pred, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An inventory: gw-1 in group `gateway`, gpu-1 a replica; both local, base_dir each."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCHESTRATOR_GATEWAY_ADMIN_KEY", CP_KEY)
    port = free_port()
    inv = {
        "hosts": {
            "gw-1": {"connection": "local", "lock_path": str(tmp_path / "gw.lock"),
                     "vars": {"base_dir": str(tmp_path / "gw"), "gateway_port": port}},
            "gpu-1": {"connection": "local", "lock_path": str(tmp_path / "gpu.lock"),
                      "vars": {"base_dir": str(tmp_path / "gpu")}},
        },
        "groups": {"gateway": {"hosts": ["gw-1"]}, "replicas": {"hosts": ["gpu-1"]}},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    started: list[str] = []
    yield path, port, started
    host = Host(HostSpec(name="gw-1", connection="local"),
                LocalTransport(HostSpec(name="gw-1", connection="local")), {})
    for sd in started:
        host.act("server_stop", state_dir=sd, grace=5)
    host.transport.close()


def start_gateway(tmp_path: Path, port: int, started: list[str]) -> dict[str, Any]:
    """The stand-in under the real supervisor, with a restart policy, as a stage would."""
    sd = tmp_path / "gw" / "gateway"
    sd.mkdir(parents=True)
    (sd / "control_key").write_text(CP_KEY + "\n")
    os.chmod(sd / "control_key", 0o600)
    spec = {"argv": [sys.executable, "-c", SERVE, str(port)], "log": str(sd / "server.log"),
            "key_files": [str(sd / "control_key")], "fingerprint": "f" * 64,
            "managed_by": "background", "host": "127.0.0.1", "port": port,
            "restart": {"max": 5, "window_s": 300, "backoff_s": 0.2, "backoff_max_s": 1}}
    (sd / "launch.json").write_text(json.dumps(spec))
    spec_host = HostSpec(name="gw-1", connection="local")
    host = Host(spec_host, LocalTransport(spec_host), {})
    try:
        res = host.act("server_start", state_dir=str(sd), python=sys.executable)
    finally:
        host.transport.close()
    started.append(str(sd))
    assert res.get("pidfile"), res
    return res["pidfile"]


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    saved = structlog.get_config()
    try:
        return args.func(args)
    finally:
        structlog.configure(**saved)


def test_the_gateway_host_is_found_by_its_group(fleet) -> None:
    inv, port, _ = fleet
    targets = service.resolve_targets(str(inv))
    got = {(t.label, t.kind, t.optional) for t in targets}
    assert got == {("gw-1", "sglang_server", True), ("gw-1:gateway", "gateway", False),
                   ("gpu-1", "sglang_server", False)}
    gw = next(t for t in targets if t.kind == "gateway")
    assert gw.url == f"http://127.0.0.1:{port}" and gw.state_dir.endswith("/gw/gateway")
    assert gw.control_key == CP_KEY and CP_KEY not in repr(gw)
    # the table is the only place a kind is named: without the gateway row, no gateway
    only = {"sglang_server": service.SGLANG_KIND}
    assert sorted(t.label for t in service.resolve_targets(str(inv), kinds=only)) == \
        ["gpu-1", "gw-1"]


def test_status_logs_stop_cover_the_gateway(fleet, tmp_path: Path, capsys,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    inv, port, started = fleet
    # members need the gateway stage's API (branch i25-gw); here only the supervised process
    monkeypatch.setitem(service.SERVICE_KINDS, "gateway",
                        dataclasses.replace(service.GATEWAY_KIND, members=None))
    first = start_gateway(tmp_path, port, started)
    until(lambda: "gateway up" in (tmp_path / "gw/gateway/server.log").read_text())

    assert run("status", "-i", str(inv), "--limit", "gateway", "--json") == 0
    (row,) = json.loads(capsys.readouterr().out)  # gw-1's BASE_DIR/run never ran: not shown
    assert (row["host"], row["kind"], row["state"], row["ready"]) == \
        ("gw-1:gateway", "gateway", "running", True)
    assert row["pid"] == first["pid"] and row["restarts"] == 0

    # killed: its supervisor brings it back, and status says so meanwhile
    os.kill(first["pid"], signal.SIGKILL)
    sd = tmp_path / "gw" / "gateway"
    until(lambda: json.loads((sd / "server.pid").read_text()).get("restarts") == 1)
    second = json.loads((sd / "server.pid").read_text())
    until(lambda: (sd / "server.log").read_text().count("gateway up") == 2)
    assert run("status", "-i", str(inv), "--limit", "gateway", "--json") == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["pid"], row["restarts"]) == ("running", second["pid"], 1)

    assert run("logs", "-i", str(inv), "--limit", "gateway", "-n", "20") == 0
    out = capsys.readouterr().out
    assert "gw-1:gateway | gateway up on" in out
    assert "exited with signal 9 (SIGKILL); restarting" in out
    assert CP_KEY not in out

    assert run("stop", "-i", str(inv), "--limit", "gateway", "--timeout", "5s") == 0
    out = capsys.readouterr().out
    assert f"gw-1:gateway: stopped pid {second['pid']}" in out and "gw-1:" in out
    assert out.count("\n") == 1  # the never-started BASE_DIR/run of gw-1 is not listed
    time.sleep(0.5)  # a restart would have come by now (backoff 0.2 s)
    assert json.loads((sd / "server.pid").read_text())["pid"] == second["pid"]
    assert run("status", "-i", str(inv), "--limit", "gateway", "--json") == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["detail"]) == ("stopped", "stopped on request")


def test_members_are_shown_per_worker_and_decide_readiness() -> None:
    row = {"ready": True, "detail": None}
    service.add_members(row, [
        {"id": "a", "url": "http://10.0.0.1:30000", "status": "Ready", "healthy": True},
        {"id": "b", "url": "http://10.0.0.2:30000", "status": "NotReady", "healthy": False}])
    assert row["ready"] is False and row["detail"] == "members 1/2 ready"
    row = {"ready": True, "detail": None}
    service.add_members(row, [
        {"id": "a", "url": "http://10.0.0.1:30000", "status": "ready", "healthy": True}])
    assert row["ready"] is True and row["detail"] == "members 1/1 ready"
    row = {"ready": True, "detail": None}
    service.add_members(row, None)
    assert row["ready"] is False and "did not answer" in row["detail"]
    row = {"ready": True, "detail": None}
    service.add_members(row, [])
    assert row["ready"] is False and row["detail"] == "members 0/0 ready"
    from orchestrator.cli.service_cmds import render_status
    table = render_status([{"host": "gw-1:gateway", "state": "running", "ready": True,
                            "members": [{"url": "http://10.0.0.1:30000", "status": "ready",
                                         "healthy": True}]}])
    assert table.splitlines()[2] == "  member http://10.0.0.1:30000  ready  healthy"
