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
