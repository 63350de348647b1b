"""`agent_retire` ends exactly the process named by pid + start time + boot id (real agent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.transports.local import LocalTransport
from orchestrator_sim.procs import alive


def start_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])


def test_only_the_named_process_is_ended(agent: LocalTransport) -> None:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        st = start_of(proc.pid)
        # a recycled pid (another start time) or another boot: not ours, left alone
        assert agent.act("agent_retire", pid=proc.pid, starttime=st + 1,
                           boot_id=boot) == {"was_running": False}
        assert agent.act("agent_retire", pid=proc.pid, starttime=st,
                           boot_id="0" * 36) == {"was_running": False}
        assert alive(proc.pid)
        res = agent.act("agent_retire", pid=proc.pid, starttime=st, boot_id=boot, wait=5)
        assert res["was_running"] and res["exited"], res
        assert proc.wait(5) == -15  # SIGTERM
        # gone: asking again is a no-op
        assert agent.act("agent_retire", pid=proc.pid, starttime=st,
                           boot_id=boot) == {"was_running": False}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_hello_names_the_agent_uniquely(agent: LocalTransport) -> None:
    hello = agent.agent_info
    assert hello["starttime"] == start_of(hello["pid"])
    assert hello["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    # the agent never ends itself
    assert agent.act("agent_retire", pid=hello["pid"], starttime=hello["starttime"],
                       boot_id=hello["boot_id"]) == {"was_running": False}
