"""What is at a path on the host (the agent's `path` probe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_bool as _bool
from orchestrator.facts.base import as_int as _int
from orchestrator.facts.base import fact


@fact
@dataclass(frozen=True)
class PathInfo:
    """Whether a path exists and, when it does, its type, size and permission bits."""

    probe: ClassVar[str] = "path"

    path: str | None
    exists: bool
    is_dir: bool | None
    is_file: bool | None
    size: int | None
    mode: int | None

    @classmethod
    def from_answer(cls, answer: Any) -> PathInfo:
        """Parse the `path` probe's dict."""
        a = answer if isinstance(answer, dict) else {}
        path = a.get("path")
        return cls(path=None if path is None else str(path), exists=a.get("exists") is True,
                   is_dir=_bool(a.get("is_dir")), is_file=_bool(a.get("is_file")),
                   size=_int(a.get("size")), mode=_int(a.get("mode")))
