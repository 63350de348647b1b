"""Host-key policy (strict / accept-new / changed keys) and ProxyJump, against real sshds."""

from __future__ import annotations

import getpass
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.errors import HostKeyError
from orchestrator.transports import SSHTransport
from tests.sshd import SSHDFactory, SSHServer


def _transport(closing: list[SSHTransport], spec: HostSpec, **kw: Any) -> SSHTransport:
    t = SSHTransport(spec, retry_initial=0.1, retry_max=0.2, **kw)
    closing.append(t)
    return t


def _fingerprint(server: SSHServer) -> str:
    pub = server.host_key.with_name(server.host_key.name + ".pub")
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]  # "256 SHA256:... comment (ED25519)"


def test_unknown_host_key_is_refused_with_the_fix(
    ssh_server: SSHServer, closing: list[SSHTransport], tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    t = _transport(closing, ssh_server.host_spec(known_hosts=str(known)))
    start = time.monotonic()
    with pytest.raises(HostKeyError) as info:
        t.connect(budget=30)
    assert time.monotonic() - start < 15  # never retried (the budget is 30 s)
    text = info.value.render()
    assert "unknown host key" in text and _fingerprint(ssh_server) in text
    assert f"ssh-keyscan -t ssh-ed25519 -p {ssh_server.port} {ssh_server.address} >> {known}" \
        in text
    assert "accept-new" in text
    assert known.read_text() == ""  # strict never writes


def test_accept_new_records_the_key_then_strict_trusts_it(
    ssh_server: SSHServer, closing: list[SSHTransport], tmp_path: Path
) -> None:
    known = tmp_path / "new" / "known_hosts"  # neither file nor directory exists yet
    t = _transport(closing, ssh_server.host_spec(known_hosts=str(known),
                                                 host_key_policy="accept-new"))
    assert t.run("echo ok").stdout == "ok\n"
    assert known.read_text() == ssh_server.known_hosts_line + "\n"
    assert (known.stat().st_mode & 0o777) == 0o600
    strict = _transport(closing, ssh_server.host_spec(known_hosts=str(known)))
    assert strict.run("echo strict-ok").stdout == "strict-ok\n"
    again = _transport(closing, ssh_server.host_spec(known_hosts=str(known),
                                                     host_key_policy="accept-new"))
    again.connect()
    assert known.read_text().count(ssh_server.address) == 1  # recorded once


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_host_key_is_always_refused(
    ssh_server: SSHServer, closing: list[SSHTransport], policy: str
) -> None:
    spec = ssh_server.host_spec(host_key_policy=policy)
    t = _transport(closing, spec)
    t.connect()
    old = _fingerprint(ssh_server)
    ssh_server.restart(new_host_key=True)
    before = Path(spec.known_hosts or "").read_text()
    with pytest.raises(HostKeyError) as info:
        t.run("true")  # reconnects, sees the new key, refuses: not retried
    text = info.value.render()
    assert "HOST KEY CHANGED" in text and old in text and _fingerprint(ssh_server) in text
    assert f"ssh-keygen -R '[{ssh_server.address}]:{ssh_server.port}'" in text
    assert Path(spec.known_hosts or "").read_text() == before  # accept-new does not overwrite


def _jump_config(tmp_path: Path, jump: SSHServer, target: SSHServer, key: str) -> str:
    user = getpass.getuser()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        "Host target\n"
        f"  HostName {target.address}\n"
        f"  Port {target.port}\n"
        f"  User {user}\n"
        f"  ProxyJump {user}@{jump.address}:{jump.port}\n"
        f"  IdentityFile {key}\n"
    )
    return str(cfg)


def test_proxyjump_through_ssh_config_alias(
    sshd: SSHDFactory, closing: list[SSHTransport], tmp_path: Path
) -> None:
    jump, target = sshd("127.0.0.2"), sshd("127.0.0.3")
    cfg = _jump_config(tmp_path, jump, target, str(sshd.client_key))
    known = target.known_hosts_file(tmp_path / "known_hosts", also=(jump,))
    t = _transport(closing, HostSpec(name="target", ssh_config=cfg, known_hosts=known,
                                     connect_timeout=5))
    conn = t.run("echo $SSH_CONNECTION").stdout.split()
    assert conn[2:] == [target.address, str(target.port)]  # we landed on the target...
    assert "Accepted publickey" in jump.log_file.read_text()  # ...through the jump host


def test_proxyjump_checks_the_jump_host_key_too(
    sshd: SSHDFactory, closing: list[SSHTransport], tmp_path: Path
) -> None:
    jump, target = sshd("127.0.0.2"), sshd("127.0.0.3")
    cfg = _jump_config(tmp_path, jump, target, str(sshd.client_key))
    only_target = target.known_hosts_file(tmp_path / "known_target")
    t = _transport(closing, HostSpec(name="target", ssh_config=cfg, known_hosts=only_target))
    with pytest.raises(HostKeyError) as info:
        t.connect(budget=10)
    assert "jump host" in str(info.value) and f"{jump.address}:{jump.port}" in str(info.value)
    only_jump = jump.known_hosts_file(tmp_path / "known_jump")
    t2 = _transport(closing, HostSpec(name="target", ssh_config=cfg, known_hosts=only_jump))
    with pytest.raises(HostKeyError) as info2:
        t2.connect(budget=10)
    assert "jump host" not in str(info2.value)
    assert f"[{target.address}]:{target.port}" in str(info2.value)
    # accept-new records both hops
    fresh = tmp_path / "known_fresh"
    t3 = _transport(closing, HostSpec(name="target", ssh_config=cfg, known_hosts=str(fresh),
                                      host_key_policy="accept-new"))
    assert t3.run("echo via-jump").stdout == "via-jump\n"
    assert sorted(fresh.read_text().splitlines()) == sorted(
        [jump.known_hosts_line, target.known_hosts_line])
