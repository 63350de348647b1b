"""Recovery that needs nothing from outside: the K2.6 + EAGLE-3 deploy (revisions given as the
branch `main`, no HF_TOKEN) on two simulated boxes while the model hub is out.

- gpu-1, converged and then power-cycled, recovers with the hub answering 401 (gated), 503
  (down) or refusing connections (unreachable): the commit its verified downloads record is
  used, with exactly one warning per download stage (in the run record and `--json`).
- gpu-2, fresh, cannot: it fails at its first download with the hub's answer and what to do.
- `orchestrator pin` writes the commits gpu-1's deploy resolved; gpu-2 deployed with that vars
  file gets the same commits and no unpinned-revision warning.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_sim.fleet import SimFleet
from tests.e2e.test_recovery import PLAYBOOK, stop_fleet
from tests.runner.helpers import CliRun, cli

SCALE = 0.001
DOWNLOADS = ("target", "drafter")
CAUSES = {"hub-gated": "refused the request (HTTP 401: no token was given)",
          "hub-down": "the hub is failing (HTTP 503)",
          "hub-unreachable": "the hub cannot be reached"}
FIXES = {"hub-gated": "HF_TOKEN", "hub-down": "retry when the hub answers again",
         "hub-unreachable": "check the host's network"}


class Boxes:
    """Two simulated boxes and the deploys made on them."""

    def __init__(self, fleet: SimFleet, work: Path) -> None:
        self.fleet, self.work, self.n = fleet, work, 0
        self.first: CliRun | None = None  # gpu-1's first (converging) deploy

    def deploy(self, host: str, *args: str) -> CliRun:
        self.n += 1
        return cli("deploy", PLAYBOOK, "-i", str(self.fleet.inventory_path), "--limit", host,
                   *args, runs=self.work / f"runs-{self.n}", env={"HF_TOKEN": ""}, timeout=300)


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boxes]:
    work = tmp_path_factory.mktemp("offline")
    fleet = SimFleet.up(work / "sim", hosts=2, time_scale=SCALE)
    try:
        yield Boxes(fleet, work)
    finally:
        stop_fleet(fleet)


def warnings(facts: dict[str, Any], stage: str) -> list[str]:
    return list((facts.get(stage) or {}).get("warnings") or [])


def test_first_deploy_warns_once_per_download_that_revisions_are_unpinned(boxes: Boxes) -> None:
    r = boxes.deploy("gpu-1")
    assert r.code == 0, r.stdout[-3000:] + r.stderr
    boxes.first = r
    facts = r.summary["hosts"]["gpu-1"]["facts"]
    for stage in DOWNLOADS:
        [warning] = warnings(facts, stage)
        assert "is a branch" in warning and facts[stage]["commit"] in warning
        assert r.stderr.count(warning) == 1  # the console (stderr) shows it once


@pytest.mark.parametrize("fault", list(CAUSES))
def test_a_rebooted_converged_box_recovers_while_the_hub_is_out(boxes: Boxes,
                                                               fault: str) -> None:
    if boxes.first is None:
        pytest.skip("needs the first deploy")
    boxes.fleet.fault("gpu-1", "reboot", down_seconds=1.0, wait=True)
    boxes.fleet.fault("hub", fault)
    try:
        r = boxes.deploy("gpu-1", "--json")
    finally:
        boxes.fleet.fault("hub", fault, on=False)
    assert r.code == 0, r.stdout[-3000:] + r.stderr
    out = json.loads(r.stdout)  # --json: the summary, warnings included
    facts = out["hosts"]["gpu-1"]["facts"]
    first = boxes.first.summary["hosts"]["gpu-1"]["facts"]
    for stage in DOWNLOADS:
        [warning] = warnings(facts, stage)
        assert CAUSES[fault] in warning and "orchestrator pin" in warning
        assert facts[stage]["commit"] == first[stage]["commit"]
    statuses = {k: v["status"] for k, v in out["hosts"]["gpu-1"]["stages"].items()}
    assert statuses["server"] == "changed" and statuses["ready"] == "changed", statuses


@pytest.mark.parametrize("fault", list(CAUSES))
def test_a_fresh_box_cannot_and_says_why_and_what_to_do(boxes: Boxes, fault: str) -> None:
    boxes.fleet.fault("hub", fault)
    try:
        r = boxes.deploy("gpu-2")
    finally:
        boxes.fleet.fault("hub", fault, on=False)
    assert r.code == 1, r.stdout[-3000:] + r.stderr
    stages = r.summary["hosts"]["gpu-2"]["stages"]
    failed = [s for s in DOWNLOADS if stages.get(s, {}).get("status") == "failed"]
    assert failed, stages
    text = r.stdout + r.stderr
    assert FIXES[fault] in text, text[-3000:]
    assert stages.get("server", {}).get("status") not in ("ok", "changed")


def test_pins_written_from_one_box_give_the_next_the_same_commits(boxes: Boxes) -> None:
    if boxes.first is None:
        pytest.skip("needs the first deploy")
    pins = boxes.work / "pins.yaml"
    p = cli("pin", PLAYBOOK, "-i", str(boxes.fleet.inventory_path), "--from",
            str(boxes.first.run_dir), "-o", str(pins), runs=boxes.work / "runs-pin")
    assert p.code == 0, p.stdout + p.stderr
    first = boxes.first.summary["hosts"]["gpu-1"]["facts"]
    written = yaml.safe_load(pins.read_text())
    assert {written[s]["revision"] for s in DOWNLOADS} == {first[s]["commit"] for s in DOWNLOADS}
    r = boxes.deploy("gpu-2", "--vars-file", str(pins))
    assert r.code == 0, r.stdout[-3000:] + r.stderr
    facts = r.summary["hosts"]["gpu-2"]["facts"]
    for stage in DOWNLOADS:
        assert facts[stage]["commit"] == first[stage]["commit"]
        assert facts[stage]["revision_pinned"] is True and not warnings(facts, stage)
    assert "is a branch" not in r.stderr + r.stdout


def test_greedy_answers_pinned_without_speculation_hold_speculation_to_them(
        boxes: Boxes) -> None:
    """`orchestrator pin` of a deploy WITHOUT speculation writes what the target answered
    greedily (greedy_reference); a speculative deploy with that file must answer the same, and
    a drafter that corrupts the output fails ready with the cause."""
    if boxes.first is None:
        pytest.skip("needs the first deploy")
    profile = yaml.safe_load((Path(PLAYBOOK).parents[1] / "configs/models/kimi-k2.6.yaml")
                             .read_text())
    off = boxes.work / "off.yaml"
    off.write_text(yaml.safe_dump({"speculative": {"algorithm": None},
                                   "min_accept_length": None}))
    plain = boxes.deploy("gpu-2", "--vars-file", str(off))
    assert plain.code == 0, plain.stdout[-3000:] + plain.stderr
    pins = boxes.work / "pins-greedy.yaml"
    p = cli("pin", PLAYBOOK, "-i", str(boxes.fleet.inventory_path), "--from",
            str(plain.run_dir), "-o", str(pins), runs=boxes.work / "runs-pin2")
    assert p.code == 0, p.stdout + p.stderr
    reference = yaml.safe_load(pins.read_text())["greedy_reference"]
    assert len(reference) == 3 and "greedy answers of the target" in pins.read_text()

    spec = boxes.deploy("gpu-2", "--vars-file", str(pins))
    assert spec.code == 0, spec.stdout[-3000:] + spec.stderr
    greedy = spec.summary["hosts"]["gpu-2"]["facts"]["ready"]["greedy"]
    assert greedy["speculative"] == "EAGLE3" and greedy["answers"] == reference

    broken = boxes.work / "wrong-draft.yaml"
    env = {**profile["launch"]["env"], "SGLANG_SIM_FAULT": "wrong-draft"}
    broken.write_text(yaml.safe_dump({"launch": {**profile["launch"], "env": env}}))
    bad = boxes.deploy("gpu-2", "--vars-file", str(pins), "--vars-file", str(broken))
    assert bad.code == 1
    assert "speculative decoding changes the output" in bad.stdout + bad.stderr
