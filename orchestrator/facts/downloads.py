"""Hugging Face downloads on the host: file stats, the hfcheck program's answers, the manifest.

`HfFiles` and `HfRevision` answer the agent probes `hf_files` and `hf_revision` (the converged
check: no interpreter). `HfAnswer` is not an agent probe: the venv's python
answers it (the hf_download stage runs `PYTHON -c HFCHECK OP ARGS`,
orchestrator/remote/hfcheck.py; the JSON after `ORCH_RESULT ` on its last such line).
`HfManifest` is the stage's own `.orchestrator-download.json`, read back from the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_dict as _d
from orchestrator.facts.base import as_int as _int
from orchestrator.facts.base import as_str as _s
from orchestrator.facts.base import fact


@dataclass(frozen=True)
class FileCheck:
    """One manifest file against the disk: its state and its stat now (None: missing)."""

    state: str  # ok | same | missing | size | hash
    size: int | None
    mtime_ns: int | None
    ino: int | None

    @property
    def changed(self) -> bool:
        """The file is not the verified one (missing, other size, other content)."""
        return self.state not in ("ok", "same")


@fact
@dataclass(frozen=True)
class HfFiles:
    """The manifest's files checked on the host (agent probe `hf_files`), by path."""

    probe: ClassVar[str] = "hf_files"

    files: dict[str, FileCheck]

    @classmethod
    def from_answer(cls, answer: Any) -> HfFiles:
        """Parse hf_files' `{path: [state, size, mtime_ns, ino]}`."""
        files: dict[str, FileCheck] = {}
        for path, row in _d(answer).items():
            if isinstance(row, list) and len(row) == 4 and isinstance(row[0], str):
                files[str(path)] = FileCheck(row[0], _int(row[1]), _int(row[2]), _int(row[3]))
        return cls(files=files)


@fact
@dataclass(frozen=True)
class HfRevision:
    """The commit a branch names on the hub (agent probe `hf_revision`), or why it is unknown."""

    probe: ClassVar[str] = "hf_revision"

    commit: str | None
    error: str | None
    status: int | None

    @classmethod
    def from_answer(cls, answer: Any) -> HfRevision:
        """Parse hf_revision's `{"commit"}` or `{"error", "status"}`."""
        a = _d(answer)
        commit = _s(a.get("commit"))
        return cls(commit=commit, error=_s(a.get("error")) if commit is None else None,
                   status=_int(a.get("status")))


@dataclass(frozen=True)
class VerifiedFile:
    """One file whose size and hash matched the hub (a manifest entry)."""

    path: str
    size: int
    hash: str | None
    mtime_ns: int | None
    #: the inode (None in manifests written before it was recorded)
    ino: int | None = None

    @classmethod
    def from_answer(cls, answer: Any) -> VerifiedFile:
        a = _d(answer)
        return cls(path=str(a.get("path")), size=_int(a.get("size")) or 0,
                   hash=_s(a.get("hash")), mtime_ns=_int(a.get("mtime_ns")),
                   ino=_int(a.get("ino")))


@dataclass(frozen=True)
class FileProblem:
    """One file that is missing, of the wrong size or hash (verify deleted the latter two)."""

    path: str
    problem: str
    expected: Any
    actual: Any
    algo: str | None


@dataclass(frozen=True)
class HfError:
    """An error answer: its kind (gated, network, ...), HTTP status and message."""

    kind: str | None
    status: int | None
    message: str


@fact
@dataclass(frozen=True)
class HfAnswer:
    """One op's answer: resolve (commit), download (commit, file_count, bytes), verify
    (commit, files, problems, bytes, extra), or an error."""

    probe: ClassVar[str] = "hfcheck"

    error: HfError | None
    commit: str | None
    file_count: int | None
    bytes: int | None
    files: tuple[VerifiedFile, ...]
    problems: tuple[FileProblem, ...]
    extra: tuple[str, ...]

    @classmethod
    def from_answer(cls, answer: Any) -> HfAnswer:
        """Parse the ORCH_RESULT JSON of one hfcheck op."""
        a = _d(answer)
        err = a.get("error")
        error = None
        if err is not None:
            e = _d(err)
            error = HfError(kind=_s(e.get("kind")), status=_int(e.get("status")),
                            message=str(e.get("message") or ""))
        files = a.get("files")
        problems = tuple(FileProblem(path=str(p.get("path")), problem=str(p.get("problem")),
                                     expected=p.get("expected"), actual=p.get("actual"),
                                     algo=_s(p.get("algo")))
                         for p in map(_d, a.get("problems") or []))
        return cls(error=error, commit=_s(a.get("commit")), file_count=_int(files),
                   bytes=_int(a.get("bytes")),
                   files=tuple(map(VerifiedFile.from_answer, files))
                   if isinstance(files, list) else (),
                   problems=problems, extra=tuple(str(x) for x in a.get("extra") or []))

    @property
    def total_size(self) -> int:
        """The verified files' bytes."""
        return sum(f.size for f in self.files)


@fact
@dataclass(frozen=True)
class HfManifest:
    """What a verified download wrote into its folder (None fields: absent in the file)."""

    probe: ClassVar[str] = "hf_manifest"

    repo: str | None
    repo_type: str
    commit: str | None
    allow_patterns: Any
    ignore_patterns: Any
    files: tuple[VerifiedFile, ...]

    @classmethod
    def from_answer(cls, answer: Any) -> HfManifest | None:
        """Parse the manifest's JSON; None when it is not one (no `files` list)."""
        a = _d(answer)
        if not isinstance(a.get("files"), list):
            return None
        return cls(repo=_s(a.get("repo")), repo_type=str(a.get("repo_type", "model")),
                   commit=_s(a.get("commit")), allow_patterns=a.get("allow_patterns"),
                   ignore_patterns=a.get("ignore_patterns"),
                   files=tuple(map(VerifiedFile.from_answer, a["files"])))

    @property
    def total_size(self) -> int:
        """The files' bytes."""
        return sum(f.size for f in self.files)
