"""A re-opened SSH connection first ends the agent of the dropped one, and what it still ran.

Over a real network the agent of a dropped connection can live on (sshd has not noticed; the
agent gives up on a silent client only after its client_timeout, 60 s by default), and with it
the command that was cut: a stage's retry would run beside it (two `pip install`s into one venv),
and that agent would still hold the host's deploy lock. The transport now ends it (SIGTERM:
the agent kills its commands' process groups and exits) before the re-opened connection sends
anything, and the runner then takes the lock again.

Real OpenSSH on loopback: the stage's first attempt stops its own agent (SIGSTOP), so the client
declares the connection dead after missed heartbeats while that agent still lives, holding the
lock, with the command running: it would touch a `late` file once its `sleep` (a unique
duration of 300+ s, so that the command can be found by its command line) is over. The test
asserts that no process of the command is left, not that some seconds passed without `late`:
a loaded machine may take seconds to notice the dead connection.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from orchestrator.config import load_all
from orchestrator.events import EventBus, RunLog
from orchestrator.logs import configure
from orchestrator.options import RunOptions
from orchestrator.plan import Selection, build_plan, render_plan
from orchestrator.run.parallel import ParallelRun
from orchestrator.run.state import RunState
from orchestrator.transports.ssh import SSHTransport
from orchestrator_sim.procs import alive
from tests.runner.helpers import write_yaml
from tests.sshd import SSHDFactory, pids_matching
from tests.transports.helpers import gone, unique_sleep_arg


def test_a_reopened_connection_ends_the_dropped_agent_and_its_command_first(
        sshd: SSHDFactory, tmp_path: Path) -> None:
    server = sshd("127.0.0.2")
    spec = server.host_spec()
    lock = Path(spec.lock_path)
    mark, late, old = tmp_path / "cut", tmp_path / "late", tmp_path / "old-agent"
    nap = unique_sleep_arg()
    run = (f"if [ ! -e {mark} ]; then touch {mark}; echo $PPID > {old}; kill -STOP $PPID; "
           f"sleep {nap}; touch {late}; exit 0; fi; "
           f"grep -q '\"agent_pid\": '$PPID'[,}}]' {lock}")  # the new agent holds the lock
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "dropped", "stages": [
        {"id": "cut", "run": run, "retry": {"attempts": 2, "delay": 0, "on": ["connection"]}}]})
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {
        "box": spec.model_dump(exclude={"name"}, exclude_defaults=True)}})
    playbook, inventory = load_all(str(pb), str(inv), {})
    plan = build_plan(playbook, inventory, Selection.from_args(None, None, None, None))
    bus = EventBus("dropped-agent-test")
    events: list[dict[str, Any]] = []  # events and log lines, as their events.jsonl records
    bus.add_sink(events.append)

    def factory(host: Any, on_wait: Any = None) -> SSHTransport:
        # dead after ~1 s of silence instead of 30 s
        return SSHTransport(host, on_wait=on_wait, heartbeat=0.5, heartbeat_misses=2)

    configure(RunLog(bus.run_id, [events.append]))  # the transport's log lines, as in the CLI
    try:
        state = RunState(render_plan(plan, {}), bus, options=RunOptions(),
                         transport_factory=factory)
        outcome = ParallelRun(state).run()
        names = [e["event"] for e in events]
        # on failure, the whole story in one line each (a list of dicts is cut short by pytest)
        story = "\n".join(f"{e.get('ts')} {e.get('event')} " + ", ".join(
            f"{k}={str(v)[:160]}" for k, v in e.items() if k not in ("ts", "event", "run_id"))
            for e in events)
        assert outcome.exit_code == 0, story
        end = next(e for e in events if e["event"] == "stage.end")
        assert end["status"] == "changed" and end["attempts"] == 2
        old_pid = int(old.read_text())
        retired = [e for e in events if e["event"] == "transport.agent_retired"]
        assert [(e["pid"], e["exited"]) for e in retired] == [(old_pid, True)]
        assert names.index("transport.agent_retired") < names.index("host.lock_retaken")
        assert not alive(old_pid)
        # the cut command went with its agent: no process of it is left, it never touched `late`
        assert gone(nap), pids_matching(nap)
        assert not late.exists()
    finally:
        configure(None)
        for pid in pids_matching(nap):  # only when the test fails: the cut command lived on
            os.kill(pid, signal.SIGKILL)
