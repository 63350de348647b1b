"""One simulated host: its name, address, files and the environment its commands run in."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: environment keys a client may not set over the SSH channel
RESERVED_ENV = ("HOME", "USER", "LOGNAME", "TMPDIR")


@dataclass
class SimHost:
    """A simulated host (GPU container, its hypervisor, or a bare box).

    Commands run as real processes under the simulator's own user, with HOME, TMPDIR and
    friends inside ``root`` and the host's fake hardware tools first on PATH.
    """

    name: str
    role: str  # "container" | "hypervisor" | "bare"
    box: int
    address: str
    port: int
    root: Path
    user: str
    state_path: Path
    key_path: Path
    marker: str
    site_dir: Path
    bin_dirs: list[Path]
    python_bin_dir: Path
    ctid: int | None = None
    hypervisor: str | None = None
    container: str | None = None
    control: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / ("root" if self.user == "root" else f"home/{self.user}")

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def host_dir(self) -> Path:
        """SIMDIR/hosts/<name>: the host's root, keys and sshd files."""
        return self.root.parent

    def base_env(self) -> dict[str, str]:
        path = ":".join([str(p) for p in self.bin_dirs] + [
            str(self.python_bin_dir), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
            "/usr/bin", "/sbin", "/bin"])
        env = {
            "HOME": str(self.home),
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/sh",
            "PATH": path,
            "TMPDIR": str(self.tmp),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(self.site_dir),
            "SIM_HOST_NAME": self.name,
            "SIM_HOST_ROLE": self.role,
            "SIM_HOST_ROOT": str(self.root),
            "SIM_HOST_STATE": str(self.state_path),
            "SIM_HOST_ID": self.marker,
        }
        if self.control:
            env["SIM_CONTROL"] = self.control
        env.update(self.extra_env)
        return env

    def env(self, client_env: dict[str, str] | None = None,
            ssh_connection: str | None = None) -> dict[str, str]:
        """The environment of one command: the host's, plus what the client sent."""
        env = self.base_env()
        for key, value in (client_env or {}).items():
            if key.startswith("SIM_") or key in RESERVED_ENV or "=" in key or not key:
                continue
            if key == "PYTHONPATH":
                env[key] = f"{self.site_dir}{os.pathsep}{value}" if value else str(self.site_dir)
            elif key == "PATH":
                continue  # the host decides its PATH (like OpenSSH without AcceptEnv PATH)
            else:
                env[key] = value
        if ssh_connection:
            env["SSH_CONNECTION"] = ssh_connection
            env["SSH_CLIENT"] = " ".join(ssh_connection.split()[:2] + ssh_connection.split()[3:])
        return env

    def describe(self) -> dict:
        return {
            "name": self.name, "role": self.role, "box": self.box, "address": self.address,
            "port": self.port, "root": str(self.root), "state": str(self.state_path),
            "ctid": self.ctid, "hypervisor": self.hypervisor, "container": self.container,
            "marker": self.marker,
        }
