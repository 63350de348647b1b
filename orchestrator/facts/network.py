"""The `tcp_port` probe's answer: whether a host reaches ADDRESS:PORT (and owns ADDRESS)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import fact


@fact
@dataclass(frozen=True)
class TcpPort:
    """reach: open | refused | timeout | unreachable | unresolved | error; local: the address is
    the probing host's own (None: unknown); error: the connect error's text."""

    probe: ClassVar[str] = "tcp_port"

    reach: str
    local: bool | None
    error: str | None

    @classmethod
    def from_answer(cls, answer: Any) -> TcpPort:
        """Parse the probe's dict; anything missing reads as an error."""
        a = answer if isinstance(answer, dict) else {}
        local = a.get("local")
        err = a.get("error")
        return cls(reach=str(a.get("reach") or "error"),
                   local=local if isinstance(local, bool) else None,
                   error=str(err) if err else None)

    @property
    def listening(self) -> bool:
        """Something accepted the connection."""
        return self.reach == "open"
