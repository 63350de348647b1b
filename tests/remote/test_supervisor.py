"""orchestrator.remote.supervisor on its own: the masking, the records, and the program run the
way the host runs it (`PYTHON supervise.py launch.json`) with a tiny fake server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.remote import source, supervisor

KEY = b"sk-supervisor-canary-51c0"


@pytest.mark.parametrize("cut", range(1, len(KEY) + 8))
def test_the_key_is_masked_wherever_the_stream_is_cut(cut: int) -> None:
    data = b"a=" + KEY + b" b=" + KEY + b" tail " + KEY[:5]
    m = supervisor.Masker(KEY)
    out = b"".join(m.feed(data[i:i + cut]) for i in range(0, len(data), cut)) + m.flush()
    assert out == b"a=*** b=*** tail " + KEY[:5]


def test_no_key_passes_everything_through() -> None:
    m = supervisor.Masker(b"")
    assert m.feed(b"abc") + m.feed(b"def") + m.flush() == b"abcdef"


def test_split_hold_keeps_only_a_possible_key_start() -> None:
    assert supervisor.split_hold(b"xx sk-sup", KEY) == (b"xx ", b"sk-sup")
    assert supervisor.split_hold(b"xx sk-x", KEY) == (b"xx sk-x", b"")


def test_write_json_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "rec.json"
    supervisor.write_json(str(target), {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]


def test_proc_readers() -> None:
    assert supervisor.boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert supervisor.boot_id("/nonexistent/boot_id") is None
    st = Path(f"/proc/{os.getpid()}/stat").read_bytes().rsplit(b")", 1)[1].split()[19]
    assert supervisor.starttime(os.getpid()) == int(st)
    assert supervisor.starttime(2 ** 22 + 12345) is None


def _launch(sd: Path, code: str, **extra: object) -> Path:
    sd.mkdir(parents=True, exist_ok=True)
    (sd / "api_key").write_bytes(KEY + b"\n")
    spec = {"argv": [sys.executable, "-c", code], "env": {"FAKE": "yes"},
            "log": str(sd / "server.log"), "key_file": str(sd / "api_key"),
            "fingerprint": "f" * 64, "managed_by": "background", **extra}
    path = sd / "launch.json"
    path.write_text(json.dumps(spec))
    (sd / "supervise.py").write_text(source("supervisor"))
    return path


def test_the_program_runs_a_fake_server_and_records_it(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    code = ("import os, sys\n"
            f"print('key=' + {KEY.decode()!r} + ' env=' + os.environ['FAKE'], flush=True)\n"
            "sys.exit(3)\n")
    spec = _launch(sd, code, mkdirs=[str(tmp_path / "cache" / "x")])
    (sd / "server.log").write_text("previous run\n")
    (sd / "stop_requested").write_text("old marker\n")
    r = subprocess.run([sys.executable, str(sd / "supervise.py"), str(spec)], timeout=30)
    assert r.returncode == 1  # the server's non-zero exit
    log = (sd / "server.log").read_text()
    assert "key=*** env=yes" in log and KEY.decode() not in log
    assert "server pid" in log and "exited with code 3" in log
    assert (sd / "server.log.1").read_text() == "previous run\n"
    assert (tmp_path / "cache" / "x").is_dir()
    pidfile = json.loads((sd / "server.pid").read_text())
    assert pidfile["boot_id"] == supervisor.boot_id()
    assert pidfile["fingerprint"] == "f" * 64 and pidfile["managed_by"] == "background"
    assert pidfile["supervisor_pid"] != pidfile["pid"]
    exit_rec = json.loads((sd / "server.exit").read_text())
    assert exit_rec["pid"] == pidfile["pid"] and exit_rec["code"] == 3
    assert exit_rec["stop_requested"] is False  # the previous run's marker was cleared


def test_a_server_that_cannot_start_is_recorded(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    spec = _launch(sd, "")
    data = json.loads(spec.read_text())
    data["argv"] = [str(tmp_path / "no-such-server")]
    spec.write_text(json.dumps(data))
    r = subprocess.run([sys.executable, str(sd / "supervise.py"), str(spec)], timeout=30)
    assert r.returncode == 127
    assert json.loads((sd / "server.exit").read_text())["code"] == 127
    assert "cannot start" in (sd / "server.log").read_text()
    assert not (sd / "server.pid").exists()


# ---------------------------------------------------------------- restart on failure (issue 25)

KEY2 = b"cp-admin-canary-77e1"
FAST = {"max": 5, "window_s": 300, "backoff_s": 0.05, "backoff_max_s": 0.2}


@pytest.mark.parametrize("cut", [1, 3, 7, 64])
def test_two_keys_are_masked_wherever_the_stream_is_cut(cut: int) -> None:
    data = b"x " + KEY + b" y " + KEY2 + b" z " + KEY2[:4]
    m = supervisor.Masker(KEY, KEY2, b"")
    out = b"".join(m.feed(data[i:i + cut]) for i in range(0, len(data), cut)) + m.flush()
    assert out == b"x *** y *** z " + KEY2[:4]


def test_restart_delays_double_up_to_the_cap_and_stop_at_max_within_the_window() -> None:
    r = supervisor.Restart({"max": 4, "window_s": 10, "backoff_s": 1, "backoff_max_s": 3})
    delays = []
    for t in (0.0, 1.0, 2.0, 3.0):
        d = r.next_delay(t)
        assert d is not None
        r.allow(t, d)
        delays.append(d)
    assert delays == [1, 2, 3, 3]
    assert r.next_delay(4.0) is None  # 4 restarts within 10 s: give up
    assert r.next_delay(10.5) == 3  # the first fell out of the window: one more is allowed
    assert r.next_delay(13.5) == 1  # all fell out: the doubling starts over
    assert supervisor.Restart.of({}) is None


def _start(spec: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(spec.parent / "supervise.py"), str(spec)],
                            start_new_session=True)


def _until(pred, timeout: float = 60.0):  # generous: the suite runs 6 workers on 2 cores
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def reap():
    started: list[subprocess.Popen] = []
    yield started.append
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"


def test_a_killed_server_comes_back_with_a_new_pid_and_a_stop_does_not_restart(
        tmp_path: Path, reap) -> None:
    sd = tmp_path / "state"
    spec = _launch(sd, SLEEPER, restart=FAST)
    sup = _start(spec)
    reap(sup)
    first = _until(lambda: _json(sd / "server.pid"))
    assert first["restarts"] == 0 and first["restart"] == FAST
    _until(lambda: (sd / "server.log").read_text().count("up\n") == 1)  # printed before the kill
    os.kill(first["pid"], signal.SIGKILL)
    second = _until(lambda: (_json(sd / "server.pid") or {}).get("restarts") == 1
                    and _json(sd / "server.pid"))
    assert second["pid"] != first["pid"] and _alive(second["pid"])
    assert second["supervisor_pid"] == first["supervisor_pid"] == sup.pid
    assert second["starttime"] == supervisor.starttime(second["pid"])
    assert second["fingerprint"] == first["fingerprint"]
    rec = _json(sd / "server.exit")
    assert rec["pid"] == first["pid"] and rec["signal"] == signal.SIGKILL
    assert rec["restarting"] is True and rec["restarts"] == 1 and not rec["stop_requested"]
    _until(lambda: (sd / "server.log").read_text().count("up\n") == 2)
    # a stop as server_stop does it: the marker, then SIGTERM to the group
    (sd / "stop_requested").write_text("now\n")
    os.killpg(sup.pid, signal.SIGTERM)
    assert sup.wait(timeout=15) == 0
    rec = _json(sd / "server.exit")
    assert rec["pid"] == second["pid"] and rec["stop_requested"] is True
    assert rec["restarting"] is False and not _alive(second["pid"])
    assert _json(sd / "server.pid")["pid"] == second["pid"]  # not started again
    log = (sd / "server.log").read_text()
    assert log.count("up\n") == 2 and "restarting in 0.05s (restart 1 of at most 5" in log


def test_a_clean_exit_is_not_restarted(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    spec = _launch(sd, "print('bye')\n", restart=FAST)
    r = subprocess.run([sys.executable, str(sd / "supervise.py"), str(spec)], timeout=30)
    assert r.returncode == 0
    rec = _json(sd / "server.exit")
    assert rec["code"] == 0 and rec["restarting"] is False and rec["restarts"] == 0
    assert (sd / "server.log").read_text().count("bye\n") == 1


def test_a_server_stopped_by_the_marker_alone_is_not_restarted(tmp_path: Path, reap) -> None:
    sd = tmp_path / "state"
    sup = _start(_launch(sd, SLEEPER, restart=FAST))
    reap(sup)
    pid = _until(lambda: _json(sd / "server.pid"))["pid"]
    (sd / "stop_requested").write_text("now\n")
    os.kill(pid, signal.SIGTERM)  # the server alone, as a stop that reached only it
    assert sup.wait(timeout=15) == 0
    rec = _json(sd / "server.exit")
    assert rec["signal"] == signal.SIGTERM and rec["stop_requested"] is True
    assert _json(sd / "server.pid")["restarts"] == 0


def test_sigterm_during_the_backoff_ends_the_supervisor_at_once(tmp_path: Path, reap) -> None:
    sd = tmp_path / "state"
    slow = {"max": 5, "window_s": 300, "backoff_s": 30, "backoff_max_s": 60}
    sup = _start(_launch(sd, "import sys\nsys.exit(4)\n", restart=slow))
    reap(sup)
    _until(lambda: (_json(sd / "server.exit") or {}).get("restarting"))
    t0 = time.monotonic()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 5  # not the 30 s backoff
    rec = _json(sd / "server.exit")
    assert rec["code"] == 4 and rec["stop_requested"] is True and rec["restarting"] is False
    assert _json(sd / "server.pid")["restarts"] == 0  # never started again


def test_a_crash_loop_gives_up_after_the_limit_with_growing_delays(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    policy = {"max": 3, "window_s": 60, "backoff_s": 0.05, "backoff_max_s": 0.15}
    spec = _launch(sd, "import sys\nprint('crash', flush=True)\nsys.exit(2)\n",
                   restart=policy)
    r = subprocess.run([sys.executable, str(sd / "supervise.py"), str(spec)], timeout=30)
    assert r.returncode == supervisor.GAVE_UP
    rec = _json(sd / "server.exit")
    assert rec["gave_up"] is True and rec["restarting"] is False and rec["code"] == 2
    assert rec["restarts"] == 3 and rec["delays_s"] == [0.05, 0.1, 0.15]
    assert "3 restarts within 60s" in rec["reason"]
    assert _json(sd / "server.pid")["restarts"] == 3 and rec["pid"] == \
        _json(sd / "server.pid")["pid"]
    log = (sd / "server.log").read_text()
    assert log.splitlines().count("crash") == 4 and log.count("exited with code 2") == 4
    assert "gave up: 3 restarts within 60s" in log


def test_every_key_is_masked_across_restarts(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    (sd).mkdir(parents=True)
    (sd / "control_key").write_bytes(KEY2 + b"\n")
    code = ("import sys\n"
            f"print('api=' + {KEY.decode()!r}, 'cp=' + {KEY2.decode()!r}, flush=True)\n"
            "sys.exit(1)\n")
    spec = _launch(sd, code, key_files=[str(sd / "control_key"), str(sd / "missing")],
                   restart={"max": 2, "window_s": 60, "backoff_s": 0.01, "backoff_max_s": 0.01})
    r = subprocess.run([sys.executable, str(sd / "supervise.py"), str(spec)], timeout=30)
    assert r.returncode == supervisor.GAVE_UP
    log = (sd / "server.log").read_text()
    assert log.splitlines().count("api=*** cp=***") == 3
    assert KEY.decode() not in log and KEY2.decode() not in log
    record = (sd / "server.exit").read_text()  # the causes are the masked lines
    assert "api=*** cp=***" in record and KEY.decode() not in record and KEY2.decode() not in record
