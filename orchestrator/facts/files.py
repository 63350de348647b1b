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


@fact
@dataclass(frozen=True)
class TensorNames:
    """Whether a checkpoint's tensor names contain each asked substring (`found`), read from
    its safetensors index or single file's header (`source`; None: no safetensors there)."""

    probe: ClassVar[str] = "tensor_names"

    path: str | None
    source: str | None
    found: dict[str, bool]

    @classmethod
    def from_answer(cls, answer: Any) -> TensorNames:
        """Parse the `tensor_names` probe's dict."""
        a = answer if isinstance(answer, dict) else {}
        found = a.get("found") if isinstance(a.get("found"), dict) else {}
        path, source = a.get("path"), a.get("source")
        return cls(path=None if path is None else str(path),
                   source=str(source) if source in ("index", "header") else None,
                   found={str(k): v is True for k, v in found.items()})

    def has(self, name: str) -> bool | None:
        """True/False when the names were read, None when they could not be."""
        return None if self.source is None else self.found.get(name, False)
