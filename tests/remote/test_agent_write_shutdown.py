"""write_file and the agent's shutdown: a write that starts once the agent is exiting leaves
nothing behind (the agent exits without waiting for it, so a temp file made then would stay)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.remote.agent import Agent, FrameIO


def _agent() -> tuple[Agent, list[int]]:
    r, w = os.pipe()
    return Agent(FrameIO(r, w), b""), [r, w]


def test_a_write_started_after_shutdown_began_makes_no_temp_file(tmp_path: Path) -> None:
    agent, fds = _agent()
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    try:
        agent.shutting_down = True
        agent.op_write_file({"id": 1, "path": str(target)}, b"new")
    finally:
        for fd in fds:
            os.close(fd)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert not agent.writes


def test_a_write_before_shutdown_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    agent, fds = _agent()
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    try:
        agent.op_write_file({"id": 1, "path": str(target)}, b"new")
    finally:
        for fd in fds:
            os.close(fd)
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert not agent.writes
