"""`server_start` asked twice starts ONE server (through the real agent, LocalTransport).

The agent client re-sends a probe whose connection dropped before the answer came back
(AgentTransport._call). A cut during `server_start` thus ran it twice: two supervisors, two
servers fighting for the port, the first one orphaned (found by the soak, scripts/soak.py).
A repeated request while the previous supervisor runs now reports that one; after a stop, a
start starts a new one."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.transports.local import LocalTransport


@pytest.fixture
def agent() -> Iterator[LocalTransport]:
    t = LocalTransport(HostSpec(name="localhost", connection="local"))
    t.connect()
    try:
        yield t
    finally:
        t.close()


def write_launch(sd: Path) -> None:
    sd.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-c", "import time; time.sleep(300)"], "env": {},
            "log": str(sd / "server.log"), "key_file": None, "fingerprint": "f" * 64,
            "managed_by": "background"}
    (sd / "launch.json").write_text(json.dumps(spec))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def test_a_repeated_start_reports_the_running_server(agent: LocalTransport,
                                                     tmp_path: Path) -> None:
    sd = tmp_path / "run"
    write_launch(sd)
    first = agent.probe("server_start", state_dir=str(sd), python=sys.executable)
    sup, pid = first["supervisor_pid"], first["pidfile"]["pid"]
    try:
        assert "repeated" not in first
        # the same request again, as the client re-sends it after a dropped connection
        again = agent.probe("server_start", state_dir=str(sd), python=sys.executable)
        assert again.get("repeated") is True
        assert again["supervisor_pid"] == sup and again["pidfile"]["pid"] == pid
        assert json.loads((sd / "server.pid").read_text())["pid"] == pid
        # still exactly one server: no second supervisor was ever started
        sups = [p for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                and str(sd / "supervise.py").encode() in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert sups == [str(sup)]
        # after a stop, a start is a new server
        stop = agent.probe("server_stop", state_dir=str(sd), grace=5)
        assert stop["stopped"]
        new = agent.probe("server_start", state_dir=str(sd), python=sys.executable)
        assert "repeated" not in new and new["supervisor_pid"] != sup
        agent.probe("server_stop", state_dir=str(sd), grace=5)
    finally:
        for p in (pid, sup):
            if alive(p):
                os.killpg(os.getpgid(p), signal.SIGKILL)
