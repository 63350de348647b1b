"""orchestrator.remote.server probes through the REAL agent (LocalTransport): the supervisor,
stop, liveness (recycled pids), who holds a port, the http probe and log reading."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from orchestrator.transports.local import LocalTransport
from orchestrator_sim.procs import alive

KEY = "sk-probe-canary-7d1e2a9c"


def write_launch(sd: Path, code: str, key: bool = True) -> None:
    sd.mkdir(parents=True, exist_ok=True)
    if key:
        (sd / "api_key").write_text(KEY + "\n")
    spec = {"argv": [sys.executable, "-c", code], "env": {"PROBE_TEST": "1"},
            "log": str(sd / "server.log"), "key_file": str(sd / "api_key") if key else None,
            "fingerprint": "f" * 64, "managed_by": "background"}
    (sd / "launch.json").write_text(json.dumps(spec))


def wait_until(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_supervisor_masks_the_key_even_split_across_writes(agent: LocalTransport,
                                                          tmp_path: Path) -> None:
    sd = tmp_path / "run"
    code = (
        "import os, sys, time\n"
        f"k = {KEY!r}\n"
        "print('server_args=ServerArgs(api_key=%r, env=%s)' % (k, os.environ['PROBE_TEST']),"
        " flush=True)\n"
        "sys.stdout.write('split: ' + k[:6]); sys.stdout.flush(); time.sleep(0.3)\n"
        "sys.stdout.write(k[6:] + ' end\\n'); sys.stdout.flush()\n"
        "sys.stderr.write('partial prefix at the end: ' + k[:5] + '\\n'); sys.stderr.flush()\n"
        "sys.exit(3)\n")
    write_launch(sd, code)
    (sd / "server.log").write_text("previous run\n")
    res = agent.act("server_start", state_dir=str(sd), python=sys.executable)
    pid = res["pidfile"]["pid"]
    assert res["pidfile"]["managed_by"] == "background"
    assert wait_until(lambda: (sd / "server.exit").exists())
    log = (sd / "server.log").read_text()
    assert KEY not in log
    assert "server_args=ServerArgs(api_key='***', env=1)" in log
    assert "split: *** end" in log
    assert f"partial prefix at the end: {KEY[:5]}" in log  # a prefix alone is no secret
    assert f"server pid {pid} exited with code 3" in log
    assert (sd / "server.log.1").read_text() == "previous run\n"
    st = agent.probe("server_status", state_dir=str(sd), log_lines=3)
    assert st["process"]["alive"] is False
    assert st["exit"]["code"] == 3 and st["exit"]["stop_requested"] is False
    assert st["log_tail"][-1].startswith("orchestrator-supervisor:")


def test_stop_kills_the_whole_group_after_the_grace(agent: LocalTransport,
                                                    tmp_path: Path) -> None:
    sd = tmp_path / "run"
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "print('child', child.pid, flush=True)\n"
            "time.sleep(300)\n")
    write_launch(sd, code, key=False)
    info = agent.act("server_start", state_dir=str(sd), python=sys.executable)["pidfile"]
    # the line may reach the log in pieces: wait for all of it
    assert wait_until(lambda: re.search(r"child (\d+)\n", (sd / "server.log").read_text()))
    child = int(re.search(r"child (\d+)\n", (sd / "server.log").read_text()).group(1))
    st = agent.probe("server_status", state_dir=str(sd))
    assert st["process"]["same_process"] and st["process"]["uptime_s"] is not None
    res = agent.act("server_stop", state_dir=str(sd), grace=0.5)
    assert res == {**res, "was_running": True, "stopped": True, "forced": True,
                   "pid": info["pid"]}
    # what outlived the SIGTERM is named: the server and its child (which inherited SIG_IGN)
    held = {h["pid"]: h for h in res["holdouts"]}
    assert {info["pid"], child} <= set(held), res["holdouts"]
    assert held[info["pid"]]["comm"].startswith("python") and held[info["pid"]]["state"] in "SR"
    assert not Path(f"/proc/{child}").exists() or b"Z" in Path(
        f"/proc/{child}/stat").read_bytes().rsplit(b")", 1)[1][:3]
    assert agent.act("server_stop", state_dir=str(sd))["was_running"] is False


def test_a_recycled_pid_is_not_our_server(agent: LocalTransport, tmp_path: Path) -> None:
    sd = tmp_path / "run"
    sd.mkdir()
    me = os.getpid()  # alive, but not the process the pid file describes
    (sd / "server.pid").write_text(json.dumps({"pid": me, "pgid": me, "starttime": 1,
                                               "started_at": time.time()}))
    st = agent.probe("server_status", state_dir=str(sd))
    assert st["process"]["alive"] is True
    assert st["process"]["same_process"] is False
    assert agent.act("server_stop", state_dir=str(sd))["was_running"] is False
    assert Path(f"/proc/{me}").exists()


def test_port_holder_and_http_probe(agent: LocalTransport, tmp_path: Path) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            ok = self.headers.get("Authorization") == f"Bearer {KEY}"
            body = b'{"ok": true}' if ok else b'{"error": "Unauthorized"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        st = agent.probe("server_status", state_dir=str(tmp_path / "none"), host="127.0.0.1",
                         port=port, health_path="/health")
        assert st["listener"]["pid"] == os.getpid() and st["listener"]["ours"] is False
        assert st["health"]["status"] == 401
        url = f"http://127.0.0.1:{port}/x"
        ok = agent.probe("http", url=url, headers={"Authorization": f"Bearer {KEY}"})
        assert (ok["status"], json.loads(ok["body"])) == (200, {"ok": True})
        assert agent.probe("http", url=url)["status"] == 401
        other = agent.probe("server_status", state_dir=str(tmp_path), host="127.0.0.2",
                            port=port)
        assert other["listener"] is None  # bound to 127.0.0.1 only
    finally:
        srv.shutdown()
        srv.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    refused = agent.probe("http", url=f"http://127.0.0.1:{free}/health", timeout=2)
    assert refused["status"] is None and refused["error"] == "connection refused"


def test_log_read_follows_and_notices_rotation(agent: LocalTransport, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("a\nb\n")
    start = agent.probe("log_read", path=str(log), from_end=True)
    assert start["offset"] == 4 and start["data"] == ""
    with log.open("a") as fh:
        fh.write("c\n")
    more = agent.probe("log_read", path=str(log), offset=start["offset"], inode=start["inode"])
    assert more["data"] == "c\n" and not more["rotated"]
    os.replace(log, tmp_path / "server.log.1")
    log.write_text("fresh\n")
    rot = agent.probe("log_read", path=str(log), offset=more["offset"], inode=more["inode"])
    assert rot["rotated"] and rot["data"] == "fresh\n"
    tail = agent.probe("log_tail", path=str(log), lines=5)
    assert tail == {"path": str(log), "exists": True, "lines": ["fresh"], "offset": 6,
                    "inode": log.stat().st_ino}
    assert agent.probe("log_tail", path=str(tmp_path / "nope"))["exists"] is False
    # logs -f starts where its tail ended: a line still being written is not shown twice,
    # and nothing written after the tail is lost
    with log.open("a") as fh:
        fh.write("half a li")
    assert agent.probe("log_tail", path=str(log), lines=5)["lines"] == ["fresh", "half a li"]
    whole = agent.probe("log_tail", path=str(log), lines=5, complete=True)
    assert whole["lines"] == ["fresh"] and whole["offset"] == 6
    with log.open("a") as fh:
        fh.write("ne\nnext\n")
    nxt = agent.probe("log_read", path=str(log), offset=whole["offset"], inode=whole["inode"])
    assert nxt["data"] == "half a line\nnext\n" and not nxt["rotated"]


# `server_start` asked twice starts ONE server (through the real agent, LocalTransport).
#
# The agent client re-sends a probe whose connection dropped before the answer came back
# (AgentTransport._call). A cut during `server_start` thus ran it twice: two supervisors, two
# servers fighting for the port, the first one orphaned (found by the soak, scripts/soak.py).
# A repeated request while the previous supervisor runs now reports that one; after a stop, a
# start starts a new one.


def test_a_repeated_start_reports_the_running_server(agent: LocalTransport,
                                                     tmp_path: Path) -> None:
    sd = tmp_path / "run"
    write_launch(sd, "import time; time.sleep(300)", key=False)
    first = agent.act("server_start", state_dir=str(sd), python=sys.executable)
    sup, pid = first["supervisor_pid"], first["pidfile"]["pid"]
    try:
        assert "repeated" not in first
        # the same request again, as the client re-sends it after a dropped connection
        again = agent.act("server_start", state_dir=str(sd), python=sys.executable)
        assert again.get("repeated") is True
        assert again["supervisor_pid"] == sup and again["pidfile"]["pid"] == pid
        assert json.loads((sd / "server.pid").read_text())["pid"] == pid
        # still exactly one server: no second supervisor was ever started
        sups = [p for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                and str(sd / "supervise.py").encode() in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert sups == [str(sup)]
        # after a stop, a start is a new server
        stop = agent.act("server_stop", state_dir=str(sd), grace=5)
        assert stop["stopped"]
        new = agent.act("server_start", state_dir=str(sd), python=sys.executable)
        assert "repeated" not in new and new["supervisor_pid"] != sup
        agent.act("server_stop", state_dir=str(sd), grace=5)
    finally:
        for p in (pid, sup):
            if alive(p):
                os.killpg(os.getpgid(p), signal.SIGKILL)
