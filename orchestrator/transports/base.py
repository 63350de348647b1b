"""The transport interface: how the host layer talks to one host.

A transport owns remote process I/O, timeouts, reconnects and the host-key policy. It translates
paramiko/socket errors ONCE, here, into the classes of `orchestrator.errors`. Implementations:
`ssh.SSHTransport` (Fabric/paramiko) and `local.LocalTransport`.

Both run the stdlib-only agent of `orchestrator.remote.agent` on the host over one long-lived
channel, so a command costs a message, not a new SSH channel, and timeouts kill the remote
process group on the host itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.result import Result

#: Called with ("stdout"|"stderr", text) as output arrives, for live progress views.
OutputCallback = Callable[[str, str], None]


class Transport(ABC):
    """One connection to one host. Owned by exactly one worker thread at a time."""

    #: host name used in messages and errors
    name: str
    #: called (on the calling thread) after the transport re-opened a dropped connection on
    #: demand, before the request that needed it is sent; what it raises fails that request.
    #: The runner re-takes the host's deploy lock here: the lock lives with the connection.
    on_reconnect: Callable[[], None] | None = None

    @abstractmethod
    def connect(self, budget: float | None = None) -> None:
        """Connect (or reconnect), retrying transient failures for up to `budget` seconds.

        Raises AuthError / HostKeyError at once; TransientConnectError when the budget runs out.
        """

    @abstractmethod
    def close(self) -> None:
        """Close the connection; the agent kills every command still running."""

    @abstractmethod
    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        become: bool = False,
        on_output: OutputCallback | None = None,
    ) -> Result:
        """Run `command` with /bin/sh -c on the host; never raises on a non-zero exit.

        `env` values travel over the channel, never on argv. On timeout the command's whole
        process group is killed and CommandTimeout is raised. A dropped connection raises
        ConnectionLost (the command is not re-run here: retries are the stage's business).
        """

    @abstractmethod
    def read_file(self, path: str) -> bytes | None:
        """Return the file's bytes, or None when it does not exist."""

    @abstractmethod
    def write_file(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write atomically (temp file + fsync + rename), creating parent directories."""

    @abstractmethod
    def probe(self, name: str, **args: Any) -> Any:
        """Run the named read-only probe (`orchestrator.remote.probes`) on the host; its JSON
        result. An action's name is refused: it would change the host."""

    @abstractmethod
    def act(self, name: str, **args: Any) -> Any:
        """Run the named action (`orchestrator.remote.actions`: it changes the host); its JSON
        result. No cancellation check here: `Host.act` refuses after Ctrl-C, and the runner
        (deploy lock) and the transport itself (agent_retire) call this directly."""

    @abstractmethod
    def kill_all(self) -> None:
        """Stop every remote command this transport started (used on Ctrl-C)."""
