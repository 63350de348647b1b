"""tests/config reads inventories with the built-in reader unless a test says otherwise: the dev
extra installs ansible-core, whose ansible-inventory would otherwise read what the built-in
reader refuses (vault, inventory plugins), which those tests check."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _builtin_inventory_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ANSIBLE_INVENTORY", "never")
