"""Transports: how the orchestrator reaches a host (SSH, or local pipes), behind one interface.

`make_transport(spec)` picks the implementation from `spec.connection`. Both run the stdlib-only
agent of `orchestrator.remote.agent` on the host over one long-lived channel, so a command costs a
message, not a new SSH channel, and timeouts kill the remote process group on the host itself
(`agent_client.AgentTransport` is the contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.transports.agent_client import AgentTransport, OutputCallback
from orchestrator.transports.local import LocalTransport
from orchestrator.transports.ssh import SSHTransport, WaitCallback

if TYPE_CHECKING:  # the pydantic models: not imported on the way to the first connection
    from orchestrator.config.model import HostSpec

__all__ = [
    "AgentTransport",
    "LocalTransport",
    "OutputCallback",
    "SSHTransport",
    "WaitCallback",
    "make_transport",
]


def make_transport(spec: HostSpec, *, on_wait: WaitCallback | None = None,
                   read_only: bool = False) -> AgentTransport:
    """Build the transport for one host: `connection: local` -> LocalTransport, else SSH.

    `on_wait(attempt, elapsed_s, error)` is called before each wait while an SSH host does not
    answer yet (the console shows "waiting for SSH..."). `read_only`: a dry run's connection,
    whose agent writes nothing for itself on the host (no code cache).
    """
    t = LocalTransport(spec) if spec.connection == "local" else SSHTransport(spec, on_wait=on_wait)
    t.read_only = read_only
    return t
