"""The `http` probe's answer: one HTTP request made ON the host (status, body, error)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_int as _int
from orchestrator.facts.base import fact


@fact
@dataclass(frozen=True)
class HttpAnswer:
    """status (None when no answer), body text, and error ("connection refused", ...)."""

    probe: ClassVar[str] = "http"

    status: int | None
    body: str
    error: str | None

    @classmethod
    def from_answer(cls, answer: Any) -> HttpAnswer:
        """Parse the probe's dict; anything missing reads as no answer."""
        a = answer if isinstance(answer, dict) else {}
        err = a.get("error")
        return cls(status=_int(a.get("status")), body=str(a.get("body") or ""),
                   error=str(err) if err else None)

    @property
    def ok(self) -> bool:
        """200."""
        return self.status == 200

    @property
    def what(self) -> str:
        """The error, else the status (as messages print it)."""
        return str(self.error or self.status)

    @property
    def refused(self) -> bool:
        """Nothing listens (the server is still loading its weights)."""
        return self.error == "connection refused"

    def json(self) -> Any:
        """The body parsed as JSON (ValueError when it is not)."""
        return json.loads(self.body)

    def json_if_ok(self) -> Any:
        """The JSON body of a 200 answer, else None."""
        if not self.ok:
            return None
        try:
            return self.json()
        except ValueError:
            return None
