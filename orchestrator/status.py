"""The words a run uses for how a stage or a host ended: one enum, compared and written as text.

`Status` is a str enum (StrEnum's behaviour, on Python 3.10 too): its members equal their text
("ok" == Status.OK), so events.jsonl, summary.json and the console keep the same words, and code
reads `Status.FAILED` instead of a bare string that a typo would silently never match.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """How a (host, stage) node, or a whole host, ended."""

    __str__ = str.__str__
    __format__ = str.__format__

    #: the host already had what the stage wants
    OK = "ok"
    #: the stage applied a change, and its verify held
    CHANGED = "changed"
    #: a dry run (`plan`, `deploy --dry-run`) found a change to make and made none
    WOULD_CHANGE = "would-change"
    FAILED = "failed"
    #: not run: `when:` false, a stage it needs failed, the host unreachable or locked
    SKIPPED = "skipped"
    #: stopped by Ctrl-C
    INTERRUPTED = "interrupted"
    #: host only: no connection could be made (exit 3)
    UNREACHABLE = "unreachable"
    #: host only: another deploy holds the host's deploy lock
    LOCKED = "locked"
    #: host only: not finished yet (a run record written mid-run)
    PENDING = "pending"

    @property
    def bad(self) -> bool:
        """A stage status that fails the run (and blocks the stages that need it)."""
        return self in (Status.FAILED, Status.INTERRUPTED)
