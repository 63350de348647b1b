"""orchestrator.remote.supervisor on its own: the masking, the records, and the program run the
way the host runs it (`PYTHON supervise.py launch.json`) with a tiny fake server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
