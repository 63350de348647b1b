"""A deploy is a library call: `orchestrator.deploy.deploy()` runs the Kimi K2.6 + EAGLE-3
playbook in this process against a simulated 8-GPU host (over SSH, host keys checked), then again
on the converged host; typed events reach a handler passed in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.deploy import deploy
from orchestrator.events import CommandRan, EventHandler, StageApply, StageFinished
from orchestrator.sim.fleet import SimFleet
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks/kimi-k2.6-eagle3.yaml"
SCALE = 0.001  # the nominal 960 s load takes ~1 s

#: what a first deploy does on the box as found (a venv without pip, compressed-tensors 0.8.1)
FIRST = {"health": "ok", "venv": "changed", "packages": "changed", "target": "changed",
         "drafter": "changed", "inspect": "ok", "server": "changed", "ready": "changed"}


class Collector(EventHandler):
    """The typed events a test looks at."""

    def __init__(self) -> None:
        self.finished: list[StageFinished] = []
        self.applied: list[StageApply] = []
        self.commands: list[CommandRan] = []

    def on_command(self, e: CommandRan) -> None:
        self.commands.append(e)

    def on_stage_finished(self, e: StageFinished) -> None:
        self.finished.append(e)

    def on_stage_apply(self, e: StageApply) -> None:
        self.applied.append(e)


def test_kimi_k26_eagle3_deploys_in_process_then_converges(tmp_path: Path) -> None:
    fleet = SimFleet.up(tmp_path / "sim", hosts=1, time_scale=SCALE)
    try:
        as_found = subprocess.run(
            [sys.executable, str(REPO / "scripts/sim_as_found.py"), str(fleet.simdir), "gpu-1"],
            capture_output=True, text=True, timeout=180)
        assert as_found.returncode == 0, as_found.stderr

        first, seen = Collector(), Collector()
        one = deploy(PLAYBOOK, fleet.inventory_path, run_dir=tmp_path / "runs",
                     handlers=[first])
        assert one.exit_code == 0, one.summary
        assert one.statuses("gpu-1") == FIRST
        assert one.summary["hosts"]["gpu-1"]["facts"]["ready"]["accept_length"] > 1.2
        assert {e.stage: e.status for e in first.finished} == FIRST
        assert one.summary_path.exists() and one.events_path.exists()
        assert one.lock_path is not None

        two = deploy(PLAYBOOK, fleet.inventory_path, run_dir=tmp_path / "runs", handlers=[seen])
        assert two.exit_code == 0, two.summary
        assert set(two.statuses("gpu-1").values()) == {"ok"}
        assert seen.applied == [] and len(seen.finished) == len(FIRST)
        # a converged host answers from the agent alone: no command, so no interpreter, no pip,
        # no huggingface_hub, no CUDA init process (the first deploy ran plenty)
        assert first.commands and seen.commands == [], [c.command[:80] for c in seen.commands]
        uvm = {n: o.summary["hosts"]["gpu-1"]["facts"]["health"]["uvm"] for n, o in
               (("first", one), ("again", two))}
        assert uvm["first"]["cuda_init"]["code"] == 0  # idle GPUs: cuInit ran in a process
        assert uvm["again"]["cuda_init"] is None and uvm["again"]["open"]["ok"]  # proven
        assert two.run_dir != one.run_dir
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)
