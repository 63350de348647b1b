"""Stage kinds. Importing this package registers every built-in kind."""

from orchestrator.stages import shell  # noqa: F401
from orchestrator.stages.base import Converged, Needed, Stage, StageContext, stage_kinds

__all__ = ["Converged", "Needed", "Stage", "StageContext", "stage_kinds"]
