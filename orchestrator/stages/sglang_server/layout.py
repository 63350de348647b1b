"""Where the server lives: the files of its state dir (ONE place).

The supervisor on the host names the same files (orchestrator/remote/server.py: PID_FILE,
LOG_FILE, ...); `sglang_server`, `gateway`, `wait_ready` and the service commands use this
class. The API's default address and URL are SGLang's (orchestrator/sglang/api.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.remote.server import (
    EXIT_FILE,
    LAUNCH_FILE,
    LOG_FILE,
    PID_FILE,
    SUPERVISOR_FILE,
)


@dataclass(frozen=True)
class ServerLayout:
    """The files of one state dir (pid file, log, launch spec, fingerprint, key, ready marker)."""

    state_dir: str

    def path(self, name: str) -> str:
        """STATE_DIR/name."""
        return f"{self.state_dir.rstrip('/')}/{name}"

    @property
    def log(self) -> str:
        """The server's stdout+stderr."""
        return self.path(LOG_FILE)

    @property
    def pid(self) -> str:
        """The supervisor's pid file."""
        return self.path(PID_FILE)

    @property
    def exit(self) -> str:
        """The exit record."""
        return self.path(EXIT_FILE)

    @property
    def launch(self) -> str:
        """The launch spec the supervisor runs."""
        return self.path(LAUNCH_FILE)

    @property
    def fingerprint(self) -> str:
        """The launch fingerprint of the running server."""
        return self.path("fingerprint.json")

    @property
    def api_key(self) -> str:
        """The 0600 key file read by the server in-process."""
        return self.path("api_key")

    @property
    def ready(self) -> str:
        """wait_ready's marker: the server instance it verified."""
        return self.path("ready.json")

    @property
    def supervisor(self) -> str:
        """The supervisor program (systemd runs it from here)."""
        return self.path(SUPERVISOR_FILE)

    @property
    def cache(self) -> str:
        """The default JIT cache dir."""
        return self.path("cache")

