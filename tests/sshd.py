"""Real OpenSSH sshd servers for tests, on loopback (127.0.0.0/8) only.

    factory = SSHDFactory(tmp_path)          # or use the `sshd` fixture of tests/conftest.py
    server = factory("127.0.0.2")             # a fresh sshd on 127.0.0.2:<free port>
    spec = server.host_spec(name="gpu1")      # HostSpec: address, port, user, key, known_hosts
    server.stop(); server.restart()           # kill it (and its sessions); same port and key
    server.restart(new_host_key=True)         # ... with a NEW host key (a "changed key")
    factory.close()                           # stop everything (the fixture does this)

Each server gets a freshly generated ed25519 host key; every server of one factory authorizes
the factory's client key (`factory.client_key`), so ProxyJump chains work with one key.
sshd runs in the foreground (`-D -e`) with StrictModes no, UsePAM no, PermitRootLogin
prohibit-password and no pid file; its log is `<workdir>/sshd-<port>.log`.

`stop()` kills THAT sshd and its per-connection sshd processes (which OpenSSH puts in their own
sessions, so killing the listener alone would leave them), the way a reboot or a crashed sshd
drops a connection. The user's processes under it are NOT killed here: they see their pipes
close, which is what the orchestrator agent's cleanup is tested against.

Also: `pids_matching(text)` scans /proc/*/cmdline (for orphan checks), `sshd_unavailable()`
says why these servers cannot run here (not root, no sshd/ssh-keygen), for pytest.skip.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator.config.model import HostSpec

SSHD_SEARCH = "/usr/sbin:/usr/local/sbin:/sbin:" + os.environ.get("PATH", "")


def sshd_binary() -> str | None:
    """Absolute path of sshd (sshd refuses to re-exec from a relative path)."""
    return shutil.which("sshd", path=SSHD_SEARCH)


def openssh_missing() -> str | None:
    """Why OpenSSH's programs are not here (sshd, ssh, ssh-keygen), or None."""
    if not sshd_binary():
        return ("OpenSSH server (sshd) is not installed: apt-get install openssh-server "
                "(make test does it when run as root)")
    for tool in ("ssh-keygen", "ssh"):
        if not shutil.which(tool):
            return f"{tool} is not installed: apt-get install openssh-client"
    return None


def sshd_unavailable() -> str | None:
    """Why a real sshd cannot be started here, or None when it can."""
    missing = openssh_missing()
    if missing:
        return missing
    if os.geteuid() != 0:
        return "a real sshd needs root in these tests (CI runs them as root)"
    return None


def keygen(path: Path, comment: str = "orchestrator-test") -> Path:
    """Generate an unencrypted ed25519 key pair at `path` (+ .pub); return `path`."""
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            p.unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True,
    )
    return path


def free_port(address: str) -> int:
    """A TCP port that is free on `address` right now."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def pids_matching(text: str) -> list[int]:
    """PIDs of live processes whose command line (args joined by spaces) contains `text`."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            raw = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if text in raw.replace(b"\0", b" ").decode("utf-8", "replace"):
            found.append(int(name))
    return found


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    """Poll `predicate()` until it is truthy or `timeout` passes; return its last value."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= end:
            return value
        time.sleep(interval)


class SSHServer:
    """One real sshd on a loopback address; see the module docstring."""

    def __init__(self, factory: SSHDFactory, address: str, port: int) -> None:
        self.factory = factory
        self.address = address
        self.port = port
        self.user = getpass.getuser()
        self.workdir = factory.workdir
        tag = f"{address}-{port}"
        self.host_key = self.workdir / f"host_key-{tag}"
        self.config_file = self.workdir / f"sshd_config-{tag}"
        self.log_file = self.workdir / f"sshd-{tag}.log"
        self.proc: subprocess.Popen | None = None
        keygen(self.host_key, comment=f"host-{tag}")
        self._write_config()

    # ---- facts -----------------------------------------------------------------------------
    @property
    def identity_file(self) -> str:
        """The client private key authorized on this server."""
        return str(self.factory.client_key)

    @property
    def host_key_pub(self) -> str:
        """`ssh-ed25519 AAAA...` (type and base64, no comment)."""
        parts = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        """This server's line for a known_hosts file."""
        return f"{self.known_hosts_name} {self.host_key_pub}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def known_hosts_file(self, path: str | Path | None = None, *,
                         also: tuple[SSHServer, ...] = ()) -> str:
        """Write a known_hosts file with this server's key (and `also` servers'); return it."""
        target = Path(path) if path else self.workdir / f"known_hosts-{self.address}-{self.port}"
        lines = [self.known_hosts_line, *(s.known_hosts_line for s in also)]
        target.write_text("\n".join(lines) + "\n")
        return str(target)

    def host_spec(self, **overrides: Any) -> HostSpec:
        """A HostSpec reaching this server: known_hosts trusts its key, an empty ssh_config."""
        empty_cfg = self.workdir / "ssh_config-empty"
        if not empty_cfg.exists():
            empty_cfg.write_text("")
        fields: dict[str, Any] = {
            "name": f"sshd-{self.address}-{self.port}",
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "identity_file": self.identity_file,
            "known_hosts": self.known_hosts_file(),
            "ssh_config": str(empty_cfg),
            "connect_timeout": 5.0,
            "connect_budget": 10.0,
            # every test server is this machine: keep each one's deploy lock apart
            "lock_path": str(self.workdir / f"deploy-{self.address}-{self.port}.lock"),
        }
        fields.update(overrides)
        return HostSpec(**fields)

    # ---- lifecycle -------------------------------------------------------------------------
    def _write_config(self) -> None:
        self.config_file.write_text(
            "\n".join([
                f"ListenAddress {self.address}",
                f"Port {self.port}",
                f"HostKey {self.host_key}",
                f"AuthorizedKeysFile {self.factory.authorized_keys}",
                "StrictModes no",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "AllowTcpForwarding yes",
                "PidFile none",
                "LogLevel VERBOSE",
                "MaxStartups 100",
                "MaxSessions 100",
                "",
            ])
        )

    def start(self) -> SSHServer:
        """Start sshd and wait until it answers with an SSH banner."""
        if self.pid is not None:
            return self
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        log = open(self.log_file, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sshd_binary() or "/usr/sbin/sshd", "-D", "-e", "-f", str(self.config_file)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd exited with {self.proc.returncode}: {self.log_file.read_text()[-2000:]}"
                )
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd on {self.address}:{self.port} did not come up")

    def session_pids(self) -> list[int]:
        """Per-connection sshd processes under this server (not the user's processes)."""
        pid = self.pid
        if pid is None:
            return []
        out: list[int] = []
        todo = [pid]
        while todo:
            for child in _children(todo.pop()):
                if _comm(child).startswith("sshd"):
                    out.append(child)
                    todo.append(child)
        return out

    def signal_sessions(self, sig: int) -> list[int]:
        """Send `sig` to this server's per-connection sshd processes (e.g. SIGSTOP/SIGCONT)."""
        pids = self.session_pids()
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        return pids

    def stop(self) -> None:
        """Kill this sshd and its connection processes (SIGKILL): every session drops."""
        if self.proc is None:
            return
        sessions = self.session_pids()
        if self.proc.poll() is None:
            self.proc.kill()
        for p in sessions:
            try:
                os.kill(p, signal.SIGCONT)
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc = None

    def restart(self, *, new_host_key: bool = False) -> SSHServer:
        """Stop, optionally generate a new host key, start again on the same port."""
        self.stop()
        if new_host_key:
            keygen(self.host_key, comment="host-new")
        return self.start()


class SSHDFactory:
    """Starts SSHServer instances sharing one work dir and one authorized client key."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client_key = keygen(self.workdir / "client_key", comment="client")
        self.authorized_keys = self.workdir / "authorized_keys"
        self.authorized_keys.write_text(
            self.client_key.with_name("client_key.pub").read_text()
        )
        self.servers: list[SSHServer] = []

    def __call__(self, address: str = "127.0.0.1", port: int | None = None) -> SSHServer:
        """Start a new sshd on `address` (loopback only) and a free (or given) port."""
        if not address.startswith("127."):
            raise ValueError("test sshd servers listen on loopback (127.0.0.0/8) only")
        server = SSHServer(self, address, port or free_port(address))
        self.servers.append(server)
        return server.start()

    def new_client_key(self, name: str) -> str:
        """A fresh key pair that is NOT authorized anywhere; returns the private key path."""
        return str(keygen(self.workdir / name, comment=name))

    def close(self) -> None:
        """Stop every server this factory started."""
        for server in self.servers:
            server.stop()
