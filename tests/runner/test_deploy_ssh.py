"""The CLI over REAL OpenSSH servers on 127.0.0.x: parallel hosts, a failing host, sshd killed
mid-command, an unreachable host, auth failure, Ctrl-C and --dry-run checked on the host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runner.helpers import CliRun, cli, write_yaml
from tests.sshd import SSHDFactory, SSHServer, free_port, pids_matching, wait_until


def _inventory(path: Path, servers: dict[str, SSHServer], **extra: Any) -> Path:
    hosts = {}
    for name, server in servers.items():
        spec = server.host_spec().model_dump(exclude={"name"}, exclude_defaults=True)
        hosts[name] = spec
    hosts.update(extra)
    return write_yaml(path, {"hosts": hosts})


def _popen(*args: str, runs: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(runs)}
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(p: subprocess.Popen[str], runs: Path, timeout: float = 60) -> CliRun:
    out, err = p.communicate(timeout=timeout)
    latest = runs / "latest"
    return CliRun(p.returncode, out, err, latest.resolve() if latest.exists() else None)


def test_four_hosts_in_parallel_one_failing_host_does_not_stop_the_others(
    sshd: SSHDFactory, tmp_path: Path
) -> None:
    servers = {f"h{i}": sshd(f"127.0.0.{i}") for i in range(2, 6)}
    out = tmp_path / "out"
    out.mkdir()
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "fleet", "vars": {"out": str(out)},
        "stages": [
            # a barrier, not a clock: each host waits (up to 30 s) until all four have started,
            # which only happens when they run at the same time, however slow the machine is
            {"id": "work",
             "run": "touch {{ out }}/{{ inventory_hostname }}.start; n=0; "
                    "while [ $(ls {{ out }}/*.start | wc -l) -lt 4 ] && [ $n -lt 300 ]; "
                    "do sleep 0.1; n=$((n+1)); done; "
                    "ls {{ out }}/*.start | wc -l > {{ out }}/{{ inventory_hostname }}.seen"},
            {"id": "gate", "needs": ["work"], "run": "test {{ inventory_hostname }} != h3"},
            {"id": "after", "needs": ["gate"],
             "run": "echo done > {{ out }}/{{ inventory_hostname }}.after"},
        ],
    })
    r = cli("deploy", str(pb), "-i", str(_inventory(tmp_path / "inv.yaml", servers)),
            runs=tmp_path / "runs")
    assert r.code == 1, r.stderr
    for name in ("h2", "h4", "h5"):
        assert r.statuses(name) == {"work": "changed", "gate": "changed", "after": "changed"}
        assert (out / f"{name}.after").exists()
    assert r.statuses("h3") == {"work": "changed", "gate": "failed", "after": "skipped"}
    assert not (out / "h3.after").exists()
    seen = {h: int((out / f"{h}.seen").read_text()) for h in servers}
    assert seen == {h: 4 for h in servers}, "hosts did not run concurrently"


def test_dry_run_over_ssh_changes_nothing_on_the_host(ssh_server: SSHServer,
                                                      tmp_path: Path) -> None:
    target = tmp_path / "would-be-created"
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "dry", "stages": [
        {"id": "mk", "run": f"mkdir {target}", "check": f"test -d {target}"},
        {"id": "always", "run": f"touch {target}.flag"},
    ]})
    inv = _inventory(tmp_path / "inv.yaml", {"box": ssh_server})
    r = cli("deploy", str(pb), "-i", str(inv), "--dry-run", runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert r.statuses("box") == {"mk": "would-change", "always": "would-change"}
    assert not target.exists() and not Path(f"{target}.flag").exists()


def test_sshd_killed_mid_command_then_restarted_the_run_reconnects_and_completes(
    ssh_server: SSHServer, tmp_path: Path
) -> None:
    done = tmp_path / "done"
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "reconnect", "stages": [
        {"id": "long", "run": f"sleep 2.713 && touch {done}", "check": f"test -f {done}",
         "retry": {"attempts": 3, "delay": "200ms", "on": ["connection"]}},
        {"id": "next", "needs": ["long"], "run": "true"},
    ]})
    inv = _inventory(tmp_path / "inv.yaml", {"box": ssh_server})
    runs = tmp_path / "runs"
    p = _popen("deploy", str(pb), "-i", str(inv), runs=runs)
    assert wait_until(lambda: pids_matching("sleep 2.713"), 20), "remote command never started"
    ssh_server.stop()  # kills the session: the command dies with it
    assert wait_until(lambda: not pids_matching("sleep 2.713"), 10), "remote command orphaned"
    time.sleep(0.5)
    ssh_server.restart()
    r = _finish(p, runs)
    assert r.code == 0, r.stderr
    stages = r.summary["hosts"]["box"]["stages"]
    assert stages["long"]["status"] == "changed" and stages["long"]["attempts"] >= 2
    assert stages["next"]["status"] == "changed"
    assert done.exists()
    assert any(e["event"] == "stage.retry" for e in r.events)


def test_connection_lost_without_retry_fails_the_stage(ssh_server: SSHServer,
                                                       tmp_path: Path) -> None:
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "noretry", "stages": [
        {"id": "long", "run": "sleep 3.117"}]})
    inv = _inventory(tmp_path / "inv.yaml", {"box": ssh_server})
    runs = tmp_path / "runs"
    p = _popen("deploy", str(pb), "-i", str(inv), runs=runs)
    assert wait_until(lambda: pids_matching("sleep 3.117"), 20)
    ssh_server.stop()
    threading.Timer(0.5, ssh_server.restart).start()
    r = _finish(p, runs)
    assert r.code == 1
    st = r.summary["hosts"]["box"]["stages"]["long"]
    assert st["status"] == "failed" and st["attempts"] == 1
    assert "connection" in st["error"].lower()


def test_unreachable_host_exits_3_and_the_others_still_run(sshd: SSHDFactory,
                                                          tmp_path: Path) -> None:
    good = sshd("127.0.0.2")
    dead = {"address": "127.0.0.9", "port": free_port("127.0.0.9"),
            "identity_file": good.identity_file, "known_hosts": good.known_hosts_file(),
            "connect_timeout": 1}
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "u", "stages": [{"id": "a", "run": "true"}]})
    inv = _inventory(tmp_path / "inv.yaml", {"good": good}, dead=dead)
    r = cli("deploy", str(pb), "-i", str(inv), "--wait-for-host", "2s", runs=tmp_path / "runs")
    assert r.code == 3, r.stderr
    assert r.statuses("good") == {"a": "changed"}
    assert r.summary["hosts"]["dead"]["status"] == "unreachable"
    assert "waiting for SSH" in r.stderr and "UNREACHABLE" in r.stderr


def test_auth_failure_is_reported_at_once_and_not_retried(sshd: SSHDFactory,
                                                          tmp_path: Path) -> None:
    server = sshd("127.0.0.2")
    other_key = sshd.new_client_key("intruder")
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "a", "stages": [{"id": "a", "run": "true"}]})
    spec = server.host_spec(identity_file=other_key).model_dump(exclude={"name"},
                                                                exclude_defaults=True)
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {"box": spec}})
    r = cli("deploy", str(pb), "-i", str(inv), "--wait-for-host", "60s", runs=tmp_path / "runs")
    assert r.code == 3
    assert "auth" in r.stderr.lower()
    assert not any(e["event"] == "host.waiting" for e in r.events)


def _ctrl_c_while(command: str, pb: Path, inv: Path, runs: Path) -> CliRun:
    """Deploy, press Ctrl-C once `command` runs on the host; the finished run."""
    p = _popen("deploy", str(pb), "-i", str(inv), runs=runs)
    # a bound, not a speed goal: on a loaded machine the CLI may take a while to get there
    wait_until(lambda: pids_matching(command) or p.poll() is not None, 60)
    if not pids_matching(command):
        p.kill()
        out, err = p.communicate(timeout=10)
        raise AssertionError(f"{command!r} never ran on the host:\n{out}\n{err}")
    p.send_signal(signal.SIGINT)
    r = _finish(p, runs, timeout=60)
    assert r.code == 130, r.stderr
    return r


def test_ctrl_c_stops_remote_commands_writes_the_record_and_exits_130(
    ssh_server: SSHServer, tmp_path: Path
) -> None:
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "int", "stages": [
        {"id": "long", "run": "sleep 30.417"},
        {"id": "later", "needs": ["long"], "run": "true"},
    ]})
    inv = _inventory(tmp_path / "inv.yaml", {"box": ssh_server})
    r = _ctrl_c_while("sleep 30.417", pb, inv, tmp_path / "runs")
    assert wait_until(lambda: not pids_matching("sleep 30.417"), 5), "remote command left running"
    assert r.statuses("box") == {"long": "interrupted", "later": "skipped"}
    assert r.summary["exit_code"] == 130 and r.summary["finished_at"]
    assert any(e["event"] == "run.interrupted" for e in r.events)


@pytest.mark.parametrize("policy", ["strict"])
def test_unknown_host_key_is_refused_with_the_command_that_trusts_it(
    ssh_server: SSHServer, tmp_path: Path, policy: str
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    spec = ssh_server.host_spec(known_hosts=str(empty), host_key_policy=policy)
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {"box": spec.model_dump(
        exclude={"name"}, exclude_defaults=True)}})
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "k", "stages": [{"id": "a", "run": "true"}]})
    r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 3
    assert "ssh-keyscan" in r.stderr or "accept-new" in r.stderr


def test_ctrl_c_during_a_check_starts_no_apply(ssh_server: SSHServer, tmp_path: Path) -> None:
    # Ctrl-C kills the check's command; the stage then sees "not converged" and would go on to
    # its apply: a command started after Ctrl-C, which nothing would kill (found by make faults)
    applied = tmp_path / "applied"
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "int", "stages": [
        {"id": "slow-check", "check": "sleep 30.533; false", "run": f"touch {applied}"}]})
    inv = _inventory(tmp_path / "inv.yaml", {"box": ssh_server})
    r = _ctrl_c_while("sleep 30.533", pb, inv, tmp_path / "runs")
    assert r.statuses("box") == {"slow-check": "interrupted"}
    assert not any(e["event"] == "command" and "touch" in e["command"] for e in r.events)
    time.sleep(0.5)
    assert not applied.exists()
