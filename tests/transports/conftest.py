"""Fixtures of the transport tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.transports.ssh import SSHTransport


@pytest.fixture
def closing() -> Iterator[list[SSHTransport]]:
    """Transports appended here are closed after the test."""
    made: list[SSHTransport] = []
    yield made
    for t in made:
        t.close()
