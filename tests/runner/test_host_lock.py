"""One deploy at a time per host: the second fails at once naming the holder; a lock left by a
dead run is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.runner.helpers import cli, write_yaml
from tests.sshd import pids_matching, wait_until


def _setup(tmp_path: Path, sleep: str) -> tuple[Path, Path, Path]:
    lock = tmp_path / "host-state" / "deploy.lock"
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {
        "box": {"connection": "local", "lock_path": str(lock)}}})
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "slow", "stages": [
        {"id": "long", "run": f"sleep {sleep}"}, {"id": "after", "needs": ["long"],
                                                  "run": "true"}]})
    return pb, inv, lock


def _start(pb: Path, inv: Path, runs: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(runs)}
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "deploy", str(pb), "-i",
                             str(inv)], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_second_concurrent_deploy_fails_fast_naming_the_holder(tmp_path: Path) -> None:
    pb, inv, lock = _setup(tmp_path, "20.381")
    first = _start(pb, inv, tmp_path / "runs1")
    try:
        assert wait_until(lambda: pids_matching("sleep 20.381"), 20)
        holder = json.loads(lock.read_text())
        second = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs2")
        assert first.poll() is None  # it did not wait for the first one to finish
        assert second.code == 1
        assert holder["run_id"] in second.stderr and "another deploy holds" in second.stderr
        assert set(second.statuses("box").values()) == {"skipped"}
        assert not any(e["event"] == "stage.start" for e in second.events)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=30)
        assert first.returncode == 130, err
    finally:
        if first.poll() is None:
            first.kill()
    # free again once the first run ended
    assert cli("deploy", str(pb), "-i", str(inv), "--skip", "long",
               runs=tmp_path / "runs3").code == 0


def test_lock_of_a_dead_run_is_taken_over(tmp_path: Path) -> None:
    pb, inv, lock = _setup(tmp_path, "5.917")
    first = _start(pb, inv, tmp_path / "runs1")
    assert wait_until(lambda: pids_matching("sleep 5.917"), 20)
    dead_run = json.loads(lock.read_text())["run_id"]
    first.send_signal(signal.SIGKILL)  # no cleanup at all: its agent goes with its pipes
    first.communicate(timeout=10)
    assert wait_until(lambda: not pids_matching("sleep 5.917"), 10)
    r = cli("deploy", str(pb), "-i", str(inv), "--skip", "long", runs=tmp_path / "runs2")
    assert r.code == 0, r.stderr
    takeover = [e for e in r.events if e["event"] == "host.lock_takeover"]
    assert takeover and takeover[0]["previous"]["run_id"] == dead_run


def _cut_once(tmp_path: Path, lock: Path, then: str) -> tuple[Path, Path]:
    """A stage whose first attempt hangs up its own agent (as sshd does when a link drops)."""
    mark = tmp_path / "cut"
    run = (f"if [ ! -e {mark} ]; then touch {mark}; {then}kill -HUP $PPID; sleep 30; fi; "
           f"grep -q '\"agent_pid\": '$PPID'[,}}]' {lock}")
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {
        "box": {"connection": "local", "lock_path": str(lock)}}})
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "cut", "stages": [
        {"id": "cut", "run": run, "retry": {"attempts": 2, "delay": 0, "on": ["connection"]}}]})
    return pb, inv


def test_a_reconnected_stage_holds_the_lock_again(tmp_path: Path) -> None:
    # the agent that held the lock is gone with its connection; the lock file names the agent
    # that runs the second attempt (the command greps for its parent's pid)
    lock = tmp_path / "host-state" / "deploy.lock"
    pb, inv = _cut_once(tmp_path, lock, "")
    r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 0, r.stdout + r.stderr
    end = next(e for e in r.events if e["event"] == "stage.end")
    assert end["status"] == "changed" and end["attempts"] == 2
    assert [e["event"] for e in r.events if e["event"].startswith("host.lock_")][-1] == \
        "host.lock_retaken"
    assert json.loads(lock.read_text() or "{}") == {}  # released at the end, as always


INTRUDER = """
import fcntl, json, os, sys, time
lock, pidfile = sys.argv[1], sys.argv[2]
fd = os.open(lock, os.O_RDWR)
open(pidfile + ".started", "w").close()
fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the cut agent to exit
os.ftruncate(fd, 0)
os.write(fd, json.dumps({"run_id": "intruder", "user": "eve"}).encode())
open(pidfile, "w").write(str(os.getpid()))
time.sleep(60)
"""


def test_another_deploy_that_slips_in_during_a_cut_stops_this_one(tmp_path: Path) -> None:
    lock = tmp_path / "host-state" / "deploy.lock"
    script, pidfile = tmp_path / "intruder.py", tmp_path / "intruder.pid"
    script.write_text(INTRUDER)
    # before hanging up, start a process (in its own session) that takes the lock as soon as
    # the cut agent has released it, like a second operator's deploy
    started = f"{pidfile}.started"
    pb, inv = _cut_once(tmp_path, lock, f"setsid {sys.executable} {script} {lock} {pidfile} "
                                        f"</dev/null >/dev/null 2>&1 & while [ ! -e {started} ]; "
                                        "do sleep 0.05; done; ")
    try:
        r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
        assert wait_until(pidfile.exists, 10)
        assert r.code == 1
        error = r.summary["hosts"]["box"]["stages"]["cut"]["error"]
        assert "another deploy holds" in error and "intruder" in error
        assert json.loads(lock.read_text())["run_id"] == "intruder"  # not overwritten
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
