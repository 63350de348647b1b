"""What is installed in a python, and the PEP 508 marker environment it evaluates against.

Not an agent probe: the python itself answers it (the pip_install stage runs
`PYTHON -c DISTRIBUTIONS NAMES_JSON`, orchestrator/remote/distributions.py); the last stdout
line, parsed as JSON (None when there is none), is the answer parsed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import fact


@fact
@dataclass(frozen=True)
class InstalledDistributions:
    """Installed version (None: not installed) by asked name, and the marker variables.

    Both are None when the answer is not the program's (e.g. sitecustomize printed last).
    """

    probe: ClassVar[str] = "distributions"

    versions: dict[str, str | None] | None
    env: dict[str, str] | None

    @classmethod
    def from_answer(cls, answer: Any) -> InstalledDistributions:
        """Parse distributions.py's `{"versions", "env"}`."""
        a = answer if isinstance(answer, dict) else {}
        versions, env = a.get("versions"), a.get("env")
        if not isinstance(versions, dict) or not isinstance(env, dict):
            return cls(versions=None, env=None)
        return cls(versions={str(k): None if v is None else str(v) for k, v in versions.items()},
                   env={str(k): str(v) for k, v in env.items()})

    @property
    def parsed(self) -> bool:
        """Whether the answer was the program's."""
        return self.versions is not None and self.env is not None
