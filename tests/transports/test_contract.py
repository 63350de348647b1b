"""The Transport contract, checked against both implementations.

`ssh` runs over a real OpenSSH sshd on loopback; `local` runs the same agent as a subprocess.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.errors import (
    CommandTimeout,
    ConnectError,
    ConnectionLost,
    TransientConnectError,
    TransportError,
)
from orchestrator.transports import LocalTransport, SSHTransport, make_transport
from orchestrator.transports.agent_client import AgentTransport
from tests.sshd import pids_matching, wait_until
from tests.transports.helpers import Background, gone, unique_sleep_arg

MakeTransport = Callable[..., AgentTransport]


@pytest.fixture(params=["local", "ssh"])
def make(request: pytest.FixtureRequest) -> Iterator[MakeTransport]:
    made: list[AgentTransport] = []
    # set the server up first, so it is torn down after the transports are closed
    server = request.getfixturevalue("ssh_server") if request.param == "ssh" else None

    def factory(**kwargs: Any) -> AgentTransport:
        if server is None:
            t: AgentTransport = LocalTransport(HostSpec(name="local", connection="local"),
                                               **kwargs)
        else:
            t = SSHTransport(server.host_spec(), **kwargs)
        made.append(t)
        return t

    yield factory
    for t in made:
        t.close()


@pytest.fixture
def transport(make: MakeTransport) -> AgentTransport:
    return make()


def test_make_transport_picks_by_connection() -> None:
    assert isinstance(make_transport(HostSpec(name="a", connection="local")), LocalTransport)
    assert isinstance(make_transport(HostSpec(name="b", address="127.0.0.1")), SSHTransport)


def test_stdout_stderr_and_exit_codes(transport: AgentTransport) -> None:
    r = transport.run("echo out; echo err >&2; printf 'no newline'; exit 7")
    assert r.exit_code == 7 and not r.ok
    assert r.stdout == "out\nno newline"
    assert r.stderr == "err\n"
    assert r.host == transport.name and r.command.startswith("echo out")
    assert transport.run("true").ok
    killed = transport.run("kill -9 $$")
    assert killed.exit_code == 128 + 9 and killed.extra.get("signal") == 9


def test_env_reaches_child_but_never_argv(transport: AgentTransport) -> None:
    canary = f"canary-{unique_sleep_arg()}"
    arg = unique_sleep_arg()
    bg = Background(lambda: transport.run(
        f'echo "${{#ORCH_SECRET}}"; sleep {arg}', env={"ORCH_SECRET": canary},
    ))
    assert wait_until(lambda: pids_matching(f"sleep {arg}"), 5)
    # while it runs, no process on the box (sh, agent, sshd, sudo) shows the value in argv
    assert pids_matching(canary) == []
    transport.kill_all()
    bg.join()
    assert bg.error is None and bg.result.stdout == f"{len(canary)}\n"  # it did arrive
    ok = transport.run('test "$ORCH_SECRET" = s3cr3t-value && echo env-ok',
                       env={"ORCH_SECRET": "s3cr3t-value"})
    assert ok.stdout == "env-ok\n"
    assert transport.run("echo ${PATH:+has-path}").stdout == "has-path\n"  # agent env kept


def test_cwd_stdin_and_missing_cwd(transport: AgentTransport, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "here.txt").write_text("x")
    assert transport.run("ls", cwd=str(tmp_path / "work")).stdout == "here.txt\n"
    assert transport.run("cat; echo", stdin=b"from stdin").stdout == "from stdin\n"
    assert transport.run("cat | wc -c").stdout.strip() == "0"  # no stdin: /dev/null
    missing = transport.run("true", cwd=str(tmp_path / "nope"))
    assert missing.exit_code == 126
    assert "cannot start command" in missing.stderr and "nope" in missing.stderr


def test_output_streams_while_running(transport: AgentTransport) -> None:
    seen: list[tuple[float, str, str]] = []
    transport.connect()
    start = time.monotonic()
    r = transport.run(
        "echo first; echo oops >&2; sleep 1.5; echo second",
        on_output=lambda stream, text: seen.append((time.monotonic() - start, stream, text)),
    )
    ended = time.monotonic() - start
    assert r.stdout == "first\nsecond\n"
    first = next(t for t, s, x in seen if s == "stdout" and "first" in x)
    assert first < ended - 0.5  # delivered while the command still ran, not at the end
    assert any(s == "stderr" and "oops" in x for _, s, x in seen)


def test_large_and_binary_output(transport: AgentTransport) -> None:
    r = transport.run("head -c 3000000 /dev/zero | tr '\\0' x; printf '\\377\\376' >&2")
    assert len(r.stdout) == 3_000_000 and set(r.stdout) == {"x"}
    assert r.stderr == "\ufffd\ufffd"  # invalid UTF-8 is replaced, not an exception


def test_timeout_kills_the_whole_process_group(transport: AgentTransport) -> None:
    a, b = unique_sleep_arg(), unique_sleep_arg()
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        transport.run(f"echo started; sleep {a} & sleep {b}", timeout=0.5)
    assert time.monotonic() - start < 10  # the sleeps were for 300+ s
    result = info.value.result
    assert result is not None and result.timed_out and result.stdout == "started\n"
    assert "timed out after 0.5s" in str(info.value)
    assert gone(f"sleep {a}") and gone(f"sleep {b}")  # background child too: whole group


def test_timeout_escalates_to_sigkill_after_the_grace(make: MakeTransport) -> None:
    t = make(kill_grace=0.3)
    marker = unique_sleep_arg()
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        t.run(f'trap "" TERM; while :; do sleep 0.05; done; : {marker}', timeout=0.3)
    assert time.monotonic() - start < 10  # the loop ignores SIGTERM: only SIGKILL ends it
    assert info.value.result is not None and info.value.result.extra.get("signal") == 9
    assert gone(marker, timeout=1)


def test_long_command_outlives_the_agents_client_timeout(make: MakeTransport) -> None:
    # the agent gives up on a silent client after 2 * 0.1 * 2 = 0.4 s; our pulses prevent that
    t = make(heartbeat=0.1, heartbeat_misses=2)
    r = t.run("sleep 0.8; echo done")
    assert r.ok and r.stdout == "done\n"


def test_kill_all_from_another_thread(transport: AgentTransport) -> None:
    arg = unique_sleep_arg()
    bg = Background(lambda: transport.run(f"sleep {arg}"))
    assert wait_until(lambda: pids_matching(f"sleep {arg}"), 5)
    transport.kill_all()
    bg.join()
    assert bg.error is None and not bg.result.ok and bg.result.extra.get("killed") == "kill"
    assert gone(f"sleep {arg}")
    assert transport.run("echo still-usable").stdout == "still-usable\n"


def test_close_kills_running_commands(transport: AgentTransport) -> None:
    arg = unique_sleep_arg()
    bg = Background(lambda: transport.run(f"sleep {arg}"))
    assert wait_until(lambda: pids_matching(f"sleep {arg}"), 5)
    transport.close()
    bg.join()
    assert isinstance(bg.error, ConnectionLost)
    assert gone(f"sleep {arg}")
    with pytest.raises(TransportError, match="closed"):
        transport.run("true")  # no silent reconnect after close() (e.g. after Ctrl-C)
    transport.connect()
    assert transport.run("echo reopened").stdout == "reopened\n"


def test_concurrent_runs_are_multiplexed(transport: AgentTransport, tmp_path: Path) -> None:
    # a barrier, not a clock: each command waits (up to 20 s) until all four have started,
    # which only happens when they run at the same time on the one connection
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    seen = f"ls {barrier} | wc -l"
    jobs = [Background(lambda i=i: transport.run(
        f"touch {barrier}/{i}; n=0; while [ $({seen}) -lt 4 ] && [ $n -lt 200 ]; "
        f"do sleep 0.1; n=$((n+1)); done; echo {i} $({seen})")) for i in range(4)]
    outs = sorted(j.join().result.stdout for j in jobs)
    assert outs == ["0 4\n", "1 4\n", "2 4\n", "3 4\n"]


def test_write_file_is_atomic_with_mode(transport: AgentTransport, tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "conf.json"
    transport.write_file(str(target), b'{"a": 1}', mode=0o640)
    assert target.read_bytes() == b'{"a": 1}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    inode = target.stat().st_ino
    transport.write_file(str(target), b"second")
    assert target.read_bytes() == b"second"
    assert target.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # mode kept when not given
    assert os.listdir(target.parent) == ["conf.json"]  # no temp files left behind


def test_write_file_failure_leaves_nothing(transport: AgentTransport, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "adir").mkdir(parents=True)
    with pytest.raises(TransportError) as info:
        transport.write_file(str(work / "adir"), b"x")  # a directory is in the way
    assert "write_file" in str(info.value)
    assert os.listdir(work) == ["adir"] and os.listdir(work / "adir") == []


def test_read_file(transport: AgentTransport, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 4096
    transport.write_file(str(tmp_path / "blob"), blob)
    assert transport.read_file(str(tmp_path / "blob")) == blob
    assert transport.read_file(str(tmp_path / "missing")) is None
    assert transport.read_file(str(tmp_path / "blob" / "under-a-file")) is None
    (tmp_path / "empty").write_bytes(b"")
    assert transport.read_file(str(tmp_path / "empty")) == b""
    with pytest.raises(TransportError, match="IsADirectoryError"):
        transport.read_file(str(tmp_path))


def test_probes(transport: AgentTransport, tmp_path: Path) -> None:
    py = transport.probe("python")
    assert py["version_info"][:1] == [3] and py["version_info"][1] >= 8 and py["executable"]
    osinfo = transport.probe("os")
    assert osinfo["sysname"] == "Linux" and osinfo["release"] == os.uname().release
    disk = transport.probe("disk_free", path=str(tmp_path / "not" / "yet"))
    assert 0 < disk["free"] <= disk["total"] and disk["checked_path"] == str(tmp_path)
    dev = transport.probe("path", path="/dev/null")
    assert dev["exists"] and dev["char_device"] and (dev["major"], dev["minor"]) == (1, 3)
    assert transport.probe("path", path=str(tmp_path / "x")) == {
        "path": str(tmp_path / "x"), "exists": False}
    home = transport.probe("env", var="HOME")
    assert home["value"] and transport.probe("env", var="ORCH_SURELY_UNSET")["value"] is None
    with pytest.raises(TransportError, match="unknown probe 'nope'; available: .*disk_free"):
        transport.probe("nope")
    with pytest.raises(TransportError, match="TypeError"):
        transport.probe("path")  # missing argument: the probe's error, reported


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_text_printed_before_the_agent_is_skipped(make: MakeTransport, tmp_path: Path) -> None:
    # like a login shell whose rc file prints a banner into a non-interactive session
    python = _script(tmp_path / "py", 'echo "Welcome!"; echo warn >&2; exec python3 "$@"\n')
    t = make(python=python)
    assert t.run("echo fine").stdout == "fine\n"


def test_refused_login_shell_is_not_retried(make: MakeTransport, tmp_path: Path) -> None:
    python = _script(tmp_path / "py", 'echo "This account is currently not available."; '
                                      "exit 1\n")
    t = make(python=python)
    start = time.monotonic()
    with pytest.raises(ConnectError) as info:
        t.connect(budget=30)
    assert not isinstance(info.value, TransientConnectError)
    assert time.monotonic() - start < 5
    assert "exit status 1" in str(info.value) and "currently not available" in str(info.value)


def test_become_as_root(transport: AgentTransport) -> None:
    if os.geteuid() != 0:
        pytest.skip("become as root is tested when the suite runs as root")
    assert transport.run("id -u", become=True).stdout == "0\n"


def test_become_through_sudo_helper(make: MakeTransport) -> None:
    """become_mode="sudo" forces the non-root path: a root helper agent under `sudo -n`."""
    if os.geteuid() != 0 or not shutil.which("sudo"):
        pytest.skip("needs root and sudo (root may sudo without a password)")
    t = make(become_mode="sudo", kill_grace=0.5)
    r = t.run('id -u; echo "$TOKEN"; echo "$SUDO_USER"', become=True, env={"TOKEN": "t0k3n"})
    assert r.stdout.splitlines() == ["0", "t0k3n", "root"]  # ran under sudo, env arrived
    arg = unique_sleep_arg()
    with pytest.raises(CommandTimeout):
        t.run(f"sleep {arg} & sleep {arg}", become=True, timeout=0.5)
    assert gone(f"sleep {arg}")
    assert t.run("id -u").stdout == "0\n"  # the plain path still works alongside
