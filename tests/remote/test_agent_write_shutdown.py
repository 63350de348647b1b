"""write_file and the agent's shutdown: a write that starts once the agent is exiting leaves
nothing behind (the agent exits without waiting for it, so a temp file made then would stay)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.remote.agent import Agent, FrameIO


def _write_new_over_old(directory: Path, shutting_down: bool) -> tuple[Path, Agent]:
    """write_file(`new`) over a file holding `old`, on an agent shutting down or not."""
    r, w = os.pipe()
    agent = Agent(FrameIO(r, w), b"")
    target = directory / "f.bin"
    target.write_bytes(b"old")
    try:
        agent.shutting_down = shutting_down
        agent.op_write_file({"id": 1, "path": str(target)}, b"new")
    finally:
        os.close(r)
        os.close(w)
    return target, agent


def test_a_write_started_after_shutdown_began_makes_no_temp_file(tmp_path: Path) -> None:
    target, agent = _write_new_over_old(tmp_path, shutting_down=True)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert not agent.writes


def test_a_write_before_shutdown_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target, agent = _write_new_over_old(tmp_path, shutting_down=False)
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert not agent.writes
