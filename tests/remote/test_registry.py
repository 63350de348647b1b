"""Probes read, actions change the host: the registry keeps them apart, the agent serves each only
through its own operation, the client never sends an action as a probe, and `Host.act` refuses
after Ctrl-C. The shipped modules import each other on the host in any order."""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.errors import Interrupted, TransportError
from orchestrator.host import Host
from orchestrator.remote import actions, agent, probes, source
from orchestrator.transports.agent_client import shipped_modules
from orchestrator.transports.local import LocalTransport

REMOTE = Path(probes.__file__).parent
CHANGING = {"server_start", "server_stop", "process_stop", "lock_acquire", "lock_release",
            "agent_retire"}


def _registry() -> tuple[dict, dict]:
    for name, _ in shipped_modules():
        importlib.import_module(f"orchestrator.remote.{name}")
    return probes.PROBES, probes.ACTIONS


def test_every_action_lives_in_actions_and_no_probe_does() -> None:
    reads, changes = _registry()
    assert set(changes) == CHANGING
    assert not set(reads) & set(changes)
    assert {inspect.getmodule(fn) for fn in changes.values()} == {actions}
    assert all(inspect.getmodule(fn) is not actions for fn in reads.values())


def test_a_name_is_a_probe_or_an_action_never_both() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        probes.probe("server_start")(lambda: None)
    with pytest.raises(ValueError, match="defined twice"):
        probes.action("disk_free")(lambda: None)


def test_module_source_is_the_file_text() -> None:
    assert probes.module_source("supervisor") == (REMOTE / "supervisor.py").read_text()
    assert source("cuda_init") == (REMOTE / "cuda_init.py").read_text()


def test_shipped_modules_import_each_other_in_any_order() -> None:
    """What the agent does on the host, in a clean interpreter, the modules given backwards."""
    mods = list(reversed(shipped_modules()))
    code = (
        "import sys, json\n"
        f"sys.path.insert(0, {str(REMOTE)!r})\n"
        "import agent\n"
        "a = agent.ShippedModules(json.loads(sys.stdin.read()))\n"
        "a.install()\n"
        "lazy = sorted(n for n in a.names('probe') if n not in a.tables['probe'])\n"
        "loaded_at_start = sorted(m for m in sys.modules if m.startswith('orchestrator.remote.'))\n"
        "errors = a.load_all()\n"
        "from orchestrator.remote.probes import module_source\n"
        "import orchestrator.remote.server as s\n"
        "assert s.__file__ == 'orchestrator/remote/server.py'\n"
        "print(json.dumps([errors, sorted(a.tables['probe']), sorted(a.tables['action']),\n"
        "                  module_source('supervisor'), lazy, loaded_at_start,\n"
        "                  a.names('probe'), a.names('action')]))\n")
    import json
    import subprocess

    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(mods), text=True,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    errors, reads, changes, sup, lazy, at_start, named_reads, named_changes = \
        json.loads(r.stdout)
    assert errors == {}
    assert set(changes) == CHANGING and "server_status" in reads
    assert sup == source("supervisor")
    # only the registry (and the bootstrap: the code cache's checks) is imported at start;
    # the rest when first called (or by load_all)
    assert at_start == ["orchestrator.remote.bootstrap", "orchestrator.remote.probes"]
    assert "gpu_facts" in lazy and "python" not in lazy
    # the names read from the modules' text are exactly the ones they register
    assert named_reads == sorted(reads) and named_changes == sorted(changes)


def test_agent_hello_lists_actions_apart(agent: LocalTransport) -> None:
    hello = agent.agent_info
    assert set(hello["actions"]) == CHANGING
    assert not set(hello["probes"]) & CHANGING


def test_an_action_is_never_sent_as_a_probe(agent: LocalTransport, tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="it is an action, sent with act"):
        agent.probe("server_stop", state_dir=str(tmp_path))
    assert agent.act("server_stop", state_dir=str(tmp_path))["was_running"] is False


def test_the_agent_refuses_each_through_the_other_operation(agent: LocalTransport,
                                                           tmp_path: Path) -> None:
    session = agent._ensure()
    with pytest.raises(TransportError, match="'server_stop' is an action, not a probe"):
        session.call("probe", {"name": "server_stop", "args": {"state_dir": str(tmp_path)}})
    with pytest.raises(TransportError, match="'disk_free' is a probe, not an action"):
        session.call("act", {"name": "disk_free", "args": {}})
    with pytest.raises(TransportError, match="unknown action 'nope'"):
        agent.act("nope")


def test_host_act_refuses_after_ctrl_c(agent: LocalTransport, tmp_path: Path) -> None:
    cancelled = threading.Event()
    host = Host(HostSpec(name="localhost", connection="local"), agent, {}, cancelled=cancelled)
    assert host.act("server_stop", state_dir=str(tmp_path))["was_running"] is False
    cancelled.set()
    with pytest.raises(Interrupted, match="action server_stop not started"):
        host.act("server_stop", state_dir=str(tmp_path))
    # reads still answer: a cancelled run may look, never change
    assert host.probe("disk_free", path=str(tmp_path))["free"] > 0


def test_agent_module_has_no_probe_registry_of_its_own() -> None:
    assert not hasattr(agent, "PROBES") and not hasattr(agent, "ACTIONS")


def test_one_boot_id_reader_answers_the_probe(agent: LocalTransport, tmp_path: Path) -> None:
    from orchestrator.remote import supervisor

    assert agent.probe("boot_id") == {"boot_id": supervisor.boot_id()}
    assert agent.agent_info["boot_id"] == supervisor.boot_id()
    assert agent.probe("boot_id", path=str(tmp_path / "absent")) == {"boot_id": None}
