"""What the server's venv has: Python, SGLang, compressed-tensors and cuDNN (the
nvidia-cudnn-cu12 wheel) versions, NVFP4 support.

Not an agent probe: the venv's own python answers it (orchestrator.stages.sglang_server.reads runs
`PYTHON -c VENV_FACTS [--nvfp4]`); its JSON line, or {"error": ...} when the python failed, is
the answer parsed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_str as _s
from orchestrator.facts.base import fact


@fact
@dataclass(frozen=True)
class VenvVersions:
    """Versions in the venv; nvfp4 is None unless asked (or when the import failed)."""

    probe: ClassVar[str] = "sglang_venv"

    python: str | None
    sglang: str | None
    compressed_tensors: str | None
    nvfp4: bool | None
    nvfp4_error: str | None
    error: str | None
    #: nvidia-cudnn-cu12's version (torch's cuDNN on a pip install), None when absent
    cudnn: str | None = None

    @classmethod
    def from_answer(cls, answer: Any) -> VenvVersions:
        """Parse the venv python's JSON answer."""
        a = answer if isinstance(answer, dict) else {}
        nv = a.get("nvfp4")
        return cls(python=_s(a.get("python")), sglang=_s(a.get("sglang")),
                   compressed_tensors=_s(a.get("compressed_tensors")),
                   nvfp4=nv if isinstance(nv, bool) else None,
                   nvfp4_error=_s(a.get("nvfp4_error")), error=_s(a.get("error")),
                   cudnn=_s(a.get("cudnn")))
