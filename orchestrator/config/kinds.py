"""The stage kinds config validates against, RECEIVED from the stages layer (never imported).

`orchestrator.stages` hands its registry over when it is imported (`provide`); config asks
`stage_kinds()` for it. So config does not import stages, and stages may import config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_provider: Callable[[], Mapping[str, Any]] | None = None


def provide(provider: Callable[[], Mapping[str, Any]]) -> None:
    """Install the function that lists the stage kinds (name -> class with `Params`)."""
    global _provider
    _provider = provider


def stage_kinds() -> dict[str, Any]:
    """The stage kinds by YAML name (empty until the stages layer provided them)."""
    return dict(_provider()) if _provider is not None else {}
