"""Stage kinds. Importing this package registers every built-in kind (one module per kind)."""

import importlib
import pkgutil

from orchestrator.config.kinds import provide
from orchestrator.stages.base import Converged, Needed, Stage, StageContext, stage_kinds

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_") and _mod.name != "base":
        importlib.import_module(f"{__name__}.{_mod.name}")

provide(lambda: dict(Stage.registry))  # config receives the kinds; it never imports stages

__all__ = ["Converged", "Needed", "Stage", "StageContext", "stage_kinds"]
