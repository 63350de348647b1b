"""A re-opened SSH connection waits for the agent of the dropped one to let go of the host lock.

Over SSH, the agent of a dropped connection may outlive it for a while (a partition: sshd has
not noticed yet). It still holds the deploy lock in this run's name, so the re-opened connection
cannot take it at once; it waits (`host.lock_handover`) and takes it when that agent exits.

Real OpenSSH on loopback: the stage's first attempt stops its own agent (SIGSTOP), so the client
declares the connection dead after missed heartbeats and re-opens one while the old agent still
lives; the command resumes the old agent 3 s later, which then sees its channel closed and exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config import load_all
from orchestrator.events import EventBus
from orchestrator.plan import Selection, build_plan
from orchestrator.runner import Runner, RunOptions
from orchestrator.transports.ssh import SSHTransport
from tests.runner.helpers import write_yaml
from tests.sshd import SSHDFactory


def test_a_reconnect_waits_for_the_dropped_agent_to_release_the_lock(
        sshd: SSHDFactory, tmp_path: Path) -> None:
    server = sshd("127.0.0.2")
    spec = server.host_spec()
    lock = Path(spec.lock_path)
    mark = tmp_path / "cut"
    run = (f"if [ ! -e {mark} ]; then touch {mark}; agent=$PPID; kill -STOP $agent; sleep 3; "
           f"kill -CONT $agent; sleep 30; fi; grep -q '\"agent_pid\": '$PPID'[,}}]' {lock}")
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "handover", "stages": [
        {"id": "cut", "run": run, "retry": {"attempts": 2, "delay": 0, "on": ["connection"]}}]})
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {
        "box": spec.model_dump(exclude={"name"}, exclude_defaults=True)}})
    playbook, inventory = load_all(str(pb), str(inv), {})
    plan = build_plan(playbook, inventory, Selection.from_args(None, None, None, None))
    bus = EventBus("handover-test")
    events: list[dict[str, Any]] = []
    bus.subscribe(events.append)

    def factory(host: Any, on_wait: Any = None) -> SSHTransport:
        # dead after ~1 s of silence instead of 30 s
        return SSHTransport(host, on_wait=on_wait, heartbeat=0.5, heartbeat_misses=2)

    outcome = Runner(plan, bus, cli_vars={}, options=RunOptions(),
                     transport_factory=factory).run()
    names = [e["event"] for e in events]
    assert outcome.exit_code == 0, [e for e in events if e["event"] == "stage.end"]
    assert "host.lock_handover" in names
    assert names.index("host.lock_handover") < names.index("host.lock_retaken")
    end = next(e for e in events if e["event"] == "stage.end")
    assert end["status"] == "changed" and end["attempts"] == 2
