"""What one configuration load read: each file (by the hash of its bytes) and each environment
variable (by name), so that a later run can tell whether the same load would come out the same
(orchestrator.plancache).

    with recording() as reads:
        load_all(playbook, inventory, cli_vars, environ=RecordingEnviron(os.environ))
    reads.files   {path as given: sha256 of the bytes read}
    reads.env     the names looked up, in order, with the values seen (None: unset)
    reads.complete  False when the load also looked at something not kept here (an Ansible
                    inventory's group_vars/ and host_vars/ folders, where a file that appears
                    later would change the result without any recorded file changing)

Outside `recording()` every note is a no-op. Stdlib only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class ReadLog:
    """The inputs of one load, as `recording()` collects them."""

    files: dict[str, str] = field(default_factory=dict)
    #: name -> the value seen (None: unset); kept in memory only
    env: dict[str, str | None] = field(default_factory=dict)
    complete: bool = True
    #: why `complete` is False
    why_not: str | None = None


_CURRENT: ContextVar[ReadLog | None] = ContextVar("orchestrator_config_reads", default=None)


def note_file(path: str, raw: bytes) -> None:
    """A configuration file was read: its path (as given) and the bytes read."""
    log = _CURRENT.get()
    if log is not None:
        log.files[path] = hashlib.sha256(raw).hexdigest()


def note_incomplete(why: str) -> None:
    """The load depended on something this log does not keep (see the module docstring)."""
    log = _CURRENT.get()
    if log is not None and log.complete:
        log.complete = False
        log.why_not = why


@contextmanager
def recording() -> Iterator[ReadLog]:
    """Collect the reads of the loads made inside the block (this thread or task only)."""
    log = ReadLog()
    token = _CURRENT.set(log)
    try:
        yield log
    finally:
        _CURRENT.reset(token)


class RecordingEnviron(Mapping[str, str]):
    """An environment (os.environ) that notes the names looked up in it, for `!env`."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def _note(self, name: str) -> None:
        log = _CURRENT.get()
        if log is not None and name not in log.env:
            log.env[name] = self._environ.get(name)

    def __getitem__(self, name: str) -> str:
        self._note(name)
        return self._environ[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._note(name)
        return name in self._environ

    def __iter__(self) -> Iterator[str]:
        note_incomplete("the load listed the whole environment")
        return iter(self._environ)

    def __len__(self) -> int:
        note_incomplete("the load listed the whole environment")
        return len(self._environ)
