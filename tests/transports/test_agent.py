"""The remote agent and probes on their own: Python 3.8 compatibility, probe logic, signals."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.errors import CommandTimeout, ConnectError, ConnectionLost
from orchestrator.remote import agent, probes
from orchestrator.transports import LocalTransport
from orchestrator.transports.agent_client import BOOTSTRAP, agent_source, shipped_modules
from tests.sshd import pids_matching, wait_until
from tests.transports.helpers import Background, gone, unique_sleep_arg


def test_shipped_code_parses_as_python_38() -> None:
    sources = {"agent": agent_source().decode(), **dict(shipped_modules())}
    assert list(sources)[:2] == ["agent", "probes"]
    for name, src in sources.items():
        tree = ast.parse(src, filename=name, feature_version=(3, 8))
        for node in ast.walk(tree):
            # 3.9+ str methods, and runtime `X | Y` unions in isinstance()
            if isinstance(node, ast.Attribute):
                assert node.attr not in {"removeprefix", "removesuffix"}, name
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
                assert not isinstance(node.args[1], ast.BinOp), name
        # module-level imports must be stdlib (optional ones belong inside functions)
        imports = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import)
                   for a in n.names}
        imports |= {(n.module or "").split(".")[0] for n in tree.body
                    if isinstance(n, ast.ImportFrom) and n.level == 0}
        assert imports <= set(__import__("sys").stdlib_module_names) | {"__future__",
                                                                         "orchestrator"}


def _python38() -> str | None:
    for candidate in (os.environ.get("ORCH_TEST_PYTHON38"), shutil.which("python3.8")):
        if not candidate or not os.path.exists(candidate):
            continue
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)":
            return candidate
    return None


def test_agent_runs_on_python_38(tmp_path: Path) -> None:
    py = _python38()
    if py is None:
        pytest.skip("no Python 3.8 interpreter here (set ORCH_TEST_PYTHON38 to one)")
    t = LocalTransport(HostSpec(name="py38", connection="local"), python=py)
    try:
        assert t.probe("python")["version_info"][:2] == [3, 8]
        assert t.run("echo ok; exit 3", stdin=b"").exit_code == 3
        t.write_file(str(tmp_path / "a" / "b"), b"x", mode=0o600)
        assert t.read_file(str(tmp_path / "a" / "b")) == b"x"
        assert set(t.agent_info["probes"]) >= {"python", "os", "disk_free", "path", "env"}
        # every shipped module loads under 3.8, the programs run by another python included
        assert t.module_errors() == {}
        assert "server_start" in t.agent_info["actions"]
        assert t.probe("uvm_facts", timeout=30)["cuda_init"]["source"] in (
            "libcuda", "simhw", "unknown")
        assert t.act("server_stop", state_dir=str(tmp_path))["was_running"] is False
        with pytest.raises(CommandTimeout):
            t.run("sleep 5", timeout=0.3)
    finally:
        t.close()


def test_too_old_python_is_explained() -> None:
    old = next((p for p in (os.environ.get("ORCH_TEST_PYTHON37"), shutil.which("python3.7"))
                if p and os.path.exists(p)
                and subprocess.run([p, "-V"], capture_output=True).returncode == 0), None)
    if old is None:
        pytest.skip("no Python 3.7 interpreter here (set ORCH_TEST_PYTHON37 to one)")
    t = LocalTransport(HostSpec(name="old", connection="local"), python=old)
    with pytest.raises(ConnectError, match="needs Python >= 3.8"):
        t.connect()


def test_os_release_parsing(tmp_path: Path) -> None:
    rel = tmp_path / "os-release"
    rel.write_text('# comment\nNAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nPRETTY=\'x y\'\n\n')
    info = probes.os_info(os_release=str(rel))
    assert info["os_release"] == {"NAME": "Ubuntu", "VERSION_ID": "22.04", "ID": "ubuntu",
                                  "PRETTY": "x y"}
    assert probes.os_info(os_release=str(tmp_path / "none"))["os_release"] is None


def test_probe_registry_refuses_duplicates() -> None:
    assert {"python", "os", "disk_free", "path", "env"} <= set(probes.PROBES)
    with pytest.raises(ValueError, match="defined twice"):
        probes.probe("path")(lambda: None)


def test_path_probe_on_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    f.chmod(0o640)
    info = probes.path_info(str(f))
    assert info["exists"] and info["is_file"] and info["size"] == 5 and info["mode"] == 0o640
    assert probes.path_info(str(f / "below"))["exists"] is False


def test_agent_terminated_kills_its_commands() -> None:
    t = LocalTransport(HostSpec(name="local", connection="local"), kill_grace=0.5)
    try:
        t.connect()
        arg = unique_sleep_arg()
        bg = Background(lambda: t.run(f"sleep {arg} & sleep {arg}"))
        assert wait_until(lambda: len(pids_matching(f"sleep {arg}")) >= 2, 5)
        os.kill(t.agent_info["pid"], signal.SIGTERM)  # the agent process this test started
        bg.join()
        assert isinstance(bg.error, ConnectionLost)
        assert gone(f"sleep {arg}")
        assert t.run("echo restarted").stdout == "restarted\n"  # a new agent on demand
    finally:
        t.close()


def test_a_command_killed_by_the_agents_hangup_is_a_lost_connection() -> None:
    """The agent hung up (as sshd does when the link drops) kills its commands and exits:
    the client sees the connection lost, never the killed command's exit 143 (each try
    races the agent's exit against the command's exit status: 1 to 2 in 20 came back as
    exit 143 before the agent stopped sending at shutdown)."""
    outcomes = []
    for _ in range(30):
        t = LocalTransport(HostSpec(name="local", connection="local"))
        try:
            t.connect()
            try:
                outcomes.append(f"exit {t.run('kill -HUP $PPID; sleep 30', timeout=20).exit_code}")
            except ConnectionLost:
                outcomes.append("lost")
        finally:
            t.close()
    assert outcomes == ["lost"] * 30


def test_agent_gives_up_on_a_silent_client() -> None:
    """A client that vanished without closing (frozen machine): the agent cleans up itself."""
    proc = subprocess.Popen([sys.executable, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    arg = unique_sleep_arg()
    try:
        init = {"op": "init", "heartbeat": 0.2, "grace": 0.3, "client_timeout": 1.0,
                "modules": []}
        proc.stdin.write(agent.encode_source(agent_source()) + agent.pack(init))
        proc.stdin.write(agent.pack({"op": "run", "id": 1, "cmd": f"sleep {arg} & sleep {arg}",
                                     "env": {}, "timeout": None, "stdin": False}))
        proc.stdin.flush()
        assert proc.stdout.read(len(agent.MAGIC)) == agent.MAGIC
        assert wait_until(lambda: len(pids_matching(f"sleep {arg}")) >= 2, 5)
        start = time.monotonic()
        assert proc.wait(10) == 2  # stdin still open, but nothing more came
        assert 0.8 < time.monotonic() - start < 5
        assert b"no message from the client" in proc.stderr.read()
        assert gone(f"sleep {arg}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
