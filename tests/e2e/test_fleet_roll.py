"""Plain deploys of 3 replicas behind the REAL gateway (smg 1.13.0) on simulated hosts, under
request load (orchestrator.run.fleet): a deploy that changes nothing takes no replica out; a new
drafter revision is downloaded on every replica before the first leaves the gateway; a changed
launch restarts at most --max-unavailable replicas at a time, losing no request; and a deploy
SIGKILLed in the middle of its roll is repaired by the next plain deploy (3/3 members Ready).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.deploy import DeployOutcome, deploy
from orchestrator.events import EventHandler, ReplicaRoll, StageFinished
from orchestrator.options import RunOptions
from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.hubrepos import EAGLE3_OLD_BRANCH
from scripts.fetch_gateway_wheels import HINT, have_wheels
from tests.e2e.test_gateway_fleet import (
    GATEWAY,
    KEYS,
    PLAYBOOK,
    PROFILE,
    REPLICAS,
    SCALE,
    Load,
    _inventory,
    _members,
    _seed_index,
    _wait,
)
from tests.sim.conftest import assert_nothing_left

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_wheels(), reason=HINT)]
PROFILE_VARS = yaml.safe_load(PROFILE.read_text())
REPO = Path(__file__).resolve().parents[2]


class Seen(EventHandler):
    """Stage ends and roll steps, in the order they were told."""

    def __init__(self) -> None:
        self.events: list[StageFinished | ReplicaRoll] = []

    def on_stage_finished(self, e: StageFinished) -> None:
        self.events.append(e)

    def on_replica_roll(self, e: ReplicaRoll) -> None:
        self.events.append(e)

    @property
    def roll(self) -> list[tuple[str, str]]:
        return [(e.host, e.step) for e in self.events if isinstance(e, ReplicaRoll)]

    def most_out_at_once(self) -> int:
        """Replicas out of rotation at once: from `removed` until `serving` (failed: stays)."""
        out: set[str] = set()
        most = 0
        for host, step in self.roll:
            if step == "removed":
                out.add(host)
            elif step == "serving":
                out.discard(host)
            most = max(most, len(out))
        return most


def _vars(drafter: str = "main", mem: float = 0.88) -> dict[str, Any]:
    return {**KEYS, "drafter": {**PROFILE_VARS["drafter"], "revision": drafter},
            "launch": {**PROFILE_VARS["launch"], "mem_fraction_static": mem}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimFleet, Path, str]]:
    tmp = tmp_path_factory.mktemp("fleet")
    sim = SimFleet.up(tmp / "sim", hosts=4, time_scale=SCALE)
    try:
        _seed_index(sim)
        inventory, base, _urls = _inventory(sim, tmp / "inventory.yaml")
        first = deploy(PLAYBOOK, inventory, run_dir=tmp / "runs",
                       cli_vars=_vars(drafter=EAGLE3_OLD_BRANCH))
        assert first.exit_code == 0, first.summary
        yield sim, inventory, base
    finally:
        pid = sim.info().get("pid")
        sim.down()
        assert_nothing_left(sim.simdir, pid)


def _deploy(inventory: Path, run_dir: Path, cli_vars: dict[str, Any], seen: Seen,
            n: int = 1) -> DeployOutcome:
    return deploy(PLAYBOOK, inventory, run_dir=run_dir, handlers=[seen], cli_vars=cli_vars,
                  options=RunOptions(max_unavailable=n))


def test_fleet_rolls(fleet: tuple[SimFleet, Path, str], tmp_path: Path) -> None:
    _sim, inventory, base = fleet
    runs = tmp_path / "runs"

    # nothing changed: no replica leaves the gateway
    same = Seen()
    with Load(base, clients=2) as load:
        out = _deploy(inventory, runs, _vars(drafter=EAGLE3_OLD_BRANCH), same)
    assert out.exit_code == 0, out.summary
    assert same.roll == [] and load.failed == []
    assert {out.statuses(h)["server"] for h in REPLICAS} == {"ok"}

    # a new drafter revision: downloaded on all 3 before the first replica leaves
    new = Seen()
    with Load(base) as load:
        time.sleep(0.3)
        out = _deploy(inventory, runs, _vars(), new)
        time.sleep(0.3)
    print(f"drafter roll: {load.sent} requests, {len(load.failed)} failed; {new.roll}")
    assert out.exit_code == 0, out.summary
    assert load.failed == [] and load.sent > 10
    order = [(e.host, e.stage if isinstance(e, StageFinished) else e.step) for e in new.events
             if isinstance(e, ReplicaRoll) or e.stage == "drafter"]
    first_out = order.index(next(x for x in order if x[1] == "removed"))
    assert {h for h, what in order[:first_out] if what == "drafter"} == set(REPLICAS), order
    for h in REPLICAS:
        assert out.statuses(h)["drafter"] == "changed" and out.statuses(h)["server"] == "changed"
        assert [s for host, s in new.roll if host == h] == [
            "removed", "drained", "redeployed", "added", "serving"], new.roll
    assert new.most_out_at_once() == 1

    # a changed launch, --max-unavailable 2: never more than 2 out, no request lost
    two = Seen()
    with Load(base) as load:
        time.sleep(0.3)
        out = _deploy(inventory, runs, _vars(mem=0.87), two, n=2)
        time.sleep(0.3)
    print(f"launch roll, 2 at a time: {load.sent} requests, {len(load.failed)} failed; "
          f"{two.roll}")
    assert out.exit_code == 0, out.summary
    assert load.failed == [] and load.sent > 10
    assert 1 <= two.most_out_at_once() <= 2
    assert {h for h, s in two.roll if s == "serving"} == set(REPLICAS)
    assert set(_members(base).values()) == {"ready"} and len(_members(base)) == 3


def _events(run_dir: Path) -> list[dict[str, Any]]:
    found = sorted(run_dir.glob("2*/events.jsonl"))  # runs/latest is linked at the end
    if not found:
        return []
    out = []
    for line in found[-1].read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def test_a_deploy_killed_mid_roll_is_repaired_by_the_next(
        fleet: tuple[SimFleet, Path, str], tmp_path: Path) -> None:
    _sim, inventory, base = fleet
    runs = tmp_path / "runs"
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(_vars(mem=0.89)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "deploy", str(PLAYBOOK), "-i", str(inventory),
         "--vars-file", str(changed), "--run-dir", str(runs), "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        _wait(lambda: any(e.get("event") == "roll.step" and e.get("step") == "removed"
                          for e in _events(runs)) or proc.poll() is not None, timeout=120)
        assert proc.poll() is None, "the deploy ended before its roll began"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    steps = [(e["host"], e["step"]) for e in _events(runs) if e.get("event") == "roll.step"]
    print(f"killed after: {steps}")
    assert "removed" in {s for _, s in steps}
    assert list(_members(base).values()).count("ready") < 3  # left out of rotation
    again = Seen()
    out = _deploy(inventory, tmp_path / "runs2", _vars(mem=0.89), again)
    print(f"repair: {again.roll}")
    assert out.exit_code == 0, out.summary
    members = _members(base)
    assert set(members.values()) == {"ready"} and len(members) == 3, members
    assert again.most_out_at_once() <= 1
    assert out.statuses(GATEWAY)["gateway"] in ("ok", "changed")
