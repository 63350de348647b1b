"""The host's deploy lock (the `lock_acquire` action's answer) and its boot id (the `boot_id`
probe), as the runner reads them (orchestrator/run/walk.py).

    answer = DeployLock.from_answer(transport.act("lock_acquire", path=..., owner=...))
    if not answer.acquired: ... answer.holder.run_id ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_str as _str
from orchestrator.facts.base import fact


def _num(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class LockHolder:
    """The record a deploy writes into the lock file it holds: the owner the runner sends
    (run id, user, operator host, pid, playbook, start time), and the agent's pid and time."""

    run_id: str | None = None
    user: str | None = None
    operator: str | None = None
    playbook: str | None = None
    started_at: str | None = None
    pid: int | None = None
    agent_pid: int | None = None
    acquired_at: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> LockHolder | None:
        """None for an empty record (free, or a holder between its flock and its write)."""
        if not isinstance(raw, dict) or not raw:
            return None
        return cls(run_id=_str(raw.get("run_id")), user=_str(raw.get("user")),
                   operator=_str(raw.get("operator")), playbook=_str(raw.get("playbook")),
                   started_at=_str(raw.get("started_at")), pid=_num(raw.get("pid")),
                   agent_pid=_num(raw.get("agent_pid")), acquired_at=_num(raw.get("acquired_at")))

    def named(self) -> dict[str, Any]:
        """The fields the record holds (None left out), as the run's events tell them."""
        return {k: v for k, v in vars(self).items() if v is not None}


@fact
@dataclass(frozen=True)
class DeployLock:
    """The `lock_acquire` action's answer (orchestrator/remote/actions.py): taken (`held_here`:
    by this very agent already; `previous`: the record of a holder that is gone), or refused
    (`holder`: who holds it)."""

    probe: ClassVar[str] = "lock_acquire"

    acquired: bool
    held_here: bool
    path: str | None
    holder: LockHolder | None
    previous: LockHolder | None

    @classmethod
    def from_answer(cls, answer: Any) -> DeployLock:
        """Parse the action's dict."""
        a = answer if isinstance(answer, dict) else {}
        return cls(acquired=bool(a.get("acquired")), held_here=bool(a.get("held_here")),
                   path=_str(a.get("path")), holder=LockHolder.parse(a.get("holder")),
                   previous=LockHolder.parse(a.get("previous")))


@fact
@dataclass(frozen=True)
class BootId:
    """The kernel's boot id (orchestrator/remote/probes.py boot_id): a new one at every boot;
    None where the host does not tell."""

    probe: ClassVar[str] = "boot_id"

    boot_id: str | None

    @classmethod
    def from_answer(cls, answer: Any) -> BootId:
        """Parse the probe's dict."""
        a = answer if isinstance(answer, dict) else {}
        return cls(boot_id=_str(a.get("boot_id")) or None)
