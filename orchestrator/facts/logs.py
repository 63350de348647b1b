"""Log facts: the last lines of a file (`log_tail`) and bytes from an offset (`log_read`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_whole as _int_or_none
from orchestrator.facts.base import fact


@fact
@dataclass(frozen=True)
class LogTail:
    """The last lines of a log, and where they end (offset, inode) for following it."""

    probe: ClassVar[str] = "log_tail"

    path: str
    exists: bool
    lines: tuple[str, ...]
    offset: int
    inode: int | None

    @classmethod
    def from_answer(cls, answer: Any) -> LogTail:
        """Parse the probe's dict."""
        a = answer if isinstance(answer, dict) else {}
        return cls(path=str(a.get("path") or ""), exists=bool(a.get("exists")),
                   lines=tuple(str(x) for x in a.get("lines") or ()),
                   offset=_int_or_none(a.get("offset")) or 0, inode=_int_or_none(a.get("inode")))


@fact
@dataclass(frozen=True)
class LogChunk:
    """Bytes of a log from an offset; `rotated` when the file was replaced or truncated."""

    probe: ClassVar[str] = "log_read"

    exists: bool
    data: str
    offset: int
    inode: int | None
    rotated: bool

    @classmethod
    def from_answer(cls, answer: Any) -> LogChunk:
        """Parse the probe's dict."""
        a = answer if isinstance(answer, dict) else {}
        return cls(exists=bool(a.get("exists")), data=str(a.get("data") or ""),
                   offset=_int_or_none(a.get("offset")) or 0, inode=_int_or_none(a.get("inode")),
                   rotated=bool(a.get("rotated")))
