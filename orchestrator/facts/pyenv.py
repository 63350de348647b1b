"""A (possible) virtual environment on the host, and what its python says of itself.

`VenvState` answers the agent probe `venv_state` (orchestrator/remote/pyenv.py). `PyInfo` and
`PipWheels` are not agent probes: the interpreter itself answers them (the python_venv stage runs
`PYTHON -c PYINFO info|info_pip|find_wheels`, orchestrator/remote/pyinfo.py); the last stdout
line, parsed as JSON, is the answer (None when the python failed or printed no JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_str as _s
from orchestrator.facts.base import fact
from orchestrator.facts.pip import InstalledDistributions

#: environment that changes what an interpreter imports: with any of these set, only the
#: interpreter itself can say what it has (the files of its venv are not the whole story)
INTERPRETER_VARS = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE"})


def pyvenv_settings(text: str) -> dict[str, str]:
    """``key = value`` lines of a pyvenv.cfg (keys lower-cased)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            key, _, value = line.partition("=")
            out[key.strip().lower()] = value.strip()
    return out


@fact
@dataclass(frozen=True)
class VenvState:
    """What is at a venv's path: nothing, a file, a folder, a venv (pyvenv.cfg's text)."""

    probe: ClassVar[str] = "venv_state"

    path: str | None
    exists: bool
    is_dir: bool
    entries: tuple[str, ...]
    pyvenv_cfg: str | None
    python_exists: bool
    skeleton_only: bool

    @classmethod
    def from_answer(cls, answer: Any) -> VenvState:
        """Parse venv_state's dict."""
        a = answer if isinstance(answer, dict) else {}
        entries = a.get("entries")
        return cls(path=_s(a.get("path")), exists=a.get("exists") is True,
                   is_dir=a.get("is_dir") is True,
                   entries=tuple(str(e) for e in entries) if isinstance(entries, list) else (),
                   pyvenv_cfg=_s(a.get("pyvenv_cfg")),
                   python_exists=a.get("python_exists") is True,
                   skeleton_only=a.get("skeleton_only") is True)

    @property
    def system_site_packages(self) -> bool:
        """include-system-site-packages of pyvenv.cfg (False when there is none)."""
        cfg = pyvenv_settings(self.pyvenv_cfg or "")
        return cfg.get("include-system-site-packages", "false").lower() == "true"


@fact
@dataclass(frozen=True)
class PyInfo:
    """An interpreter's version (None when it gave no answer) and pip's, for `info_pip`."""

    probe: ClassVar[str] = "pyinfo"

    version: str | None
    pip: str | None
    prefix: str | None
    base_prefix: str | None

    @classmethod
    def from_answer(cls, answer: Any) -> PyInfo:
        """Parse pyinfo's `info` or `info_pip` JSON."""
        a = answer if isinstance(answer, dict) else {}
        return cls(version=_s(a.get("version")), pip=_s(a.get("pip")),
                   prefix=_s(a.get("prefix")), base_prefix=_s(a.get("base_prefix")))


@fact
@dataclass(frozen=True)
class PipWheels:
    """pip wheels already on the host (pyinfo's `find_wheels`), newest first."""

    probe: ClassVar[str] = "pip_wheels"

    wheels: tuple[str, ...]

    @classmethod
    def from_answer(cls, answer: Any) -> PipWheels:
        """Parse find_wheels' JSON list (anything else: no wheels)."""
        return cls(wheels=tuple(str(w) for w in answer) if isinstance(answer, list) else ())


@fact
@dataclass(frozen=True)
class VenvInventory:
    """A venv as its files tell (agent probe `venv_inventory`, no interpreter started).

    `version` comes from pyvenv.cfg, `pip` is pip's version when its dist-info and package are
    there, `versions` (None: the files do not settle it, ask the interpreter) maps each asked
    name to its installed version, `env` holds that python's PEP 508 marker variables.
    """

    probe: ClassVar[str] = "venv_inventory"

    state: VenvState
    version: str | None
    python_ok: bool
    pip: str | None
    versions: dict[str, str | None] | None
    env: dict[str, str] | None

    @classmethod
    def from_answer(cls, answer: Any) -> VenvInventory:
        """Parse venv_inventory's dict (venv_state's keys and its own)."""
        a = answer if isinstance(answer, dict) else {}
        dists = InstalledDistributions.from_answer(a)  # the same {"versions", "env"} shape
        return cls(state=VenvState.from_answer(a), version=_s(a.get("version")),
                   python_ok=a.get("python_ok") is True, pip=_s(a.get("pip")),
                   versions=dists.versions, env=dists.env)

    @property
    def settled(self) -> bool:
        """Whether the files answered the versions (else the interpreter must be asked)."""
        return self.versions is not None and self.env is not None and self.python_ok


def venv_of(python: str) -> str | None:
    """The venv folder of VENV/bin/python (None for a python outside a bin/ folder)."""
    head, _, leaf = python.rstrip("/").rpartition("/")
    if not leaf.startswith("python") or not head.endswith("/bin"):
        return None
    return head[: -len("/bin")] or None
