"""Checks asked ahead of their turn (orchestrator.run.early): a converged host's early answers
are used, in their stages' places; one taken before an earlier stage changed the host is dropped
and the check runs again in its turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.deploy import deploy
from tests.runner.helpers import local_inventory, write_yaml


def _playbook(tmp_path: Path, config: Path) -> Path:
    inspect = {"uses": "inspect_config", "with": {
        "path": str(config), "label": "drafter",
        "expect": {"num_hidden_layers": {"equals": 1}}}}
    return write_yaml(tmp_path / "pb.yaml", {"name": "p", "stages": [
        # changes the file the next check reads, unless told not to
        {"id": "edit", "check": f"test -e {tmp_path}/keep || grep -q 2 {config}",
         "run": f"printf '{{\"num_hidden_layers\": 2}}' > {config}"},
        {"id": "inspect", "needs": ["edit"], **inspect},
        {"id": "again", "needs": ["inspect"], **inspect},
    ]})


def _deploy(tmp_path: Path, pb: Path, name: str) -> Any:
    inv = local_inventory(tmp_path / f"{name}.yaml", ("l1",))
    return deploy(pb, inv, run_dir=tmp_path / "runs")


def test_an_early_answer_taken_before_a_change_is_dropped(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 1}))
    pb = _playbook(tmp_path, config)
    # `inspect` is asked ahead of its turn while the file still holds 1 (Converged); `edit`
    # then writes 2: that answer no longer holds, and the check in its turn finds the mismatch
    out = _deploy(tmp_path, pb, "inv1")
    assert out.statuses("l1")["edit"] == "changed"
    assert out.statuses("l1")["inspect"] == "failed"
    error = out.summary.hosts["l1"].stages["inspect"].error
    assert "num_hidden_layers" in error and "2" in error


def test_a_converged_hosts_early_answers_are_used_in_their_places(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 1}))
    (tmp_path / "keep").write_text("")
    pb = _playbook(tmp_path, config)
    out = _deploy(tmp_path, pb, "inv2")
    assert out.statuses("l1") == {"edit": "ok", "inspect": "ok", "again": "ok"}
    events = [json.loads(line) for line in out.events_path.read_text().splitlines()]
    mine = [(e.get("event"), e.get("stage")) for e in events
            if e.get("stage") in ("inspect", "again")]
    # what the early check recorded is told between its stage's start and end
    for sid in ("inspect", "again"):
        start = mine.index(("stage.start", sid))
        end = mine.index(("stage.end", sid))
        assert start < end
        told = [e for e in events if e.get("stage") == sid and e.get("event") not in (
            "stage.start", "stage.end")]
        assert all(mine.index((e.get("event"), sid)) > start for e in told)
    # the log line of each check (held while it was early) is told once, in its place
    said = [e.get("stage") for e in events if e.get("event") == "inspect_config.file"]
    assert said == ["inspect", "again"]
