"""tests/conftest.py's SLOWEST_MODULES (the modules xdist starts first) name modules that exist:
a renamed module would silently go back to the end of the run."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOWEST_MODULES

REPO = Path(__file__).resolve().parents[1]


def test_the_modules_scheduled_first_exist() -> None:
    assert [m for m in SLOWEST_MODULES if not (REPO / m).is_file()] == []
