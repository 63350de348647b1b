"""summary.json is written by `summary.json_text`: the same JSON as `json.dumps(default=str)`,
objects indented for the first levels (hosts, a host, its stages and facts) and each deeper value
on one line."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.events import HostFinished, HostStarted, StageFinished
from orchestrator.summary import RunRecord, RunSummary, json_text

WHEN = datetime(2026, 12, 1, tzinfo=timezone.utc)
DATA = {
    "run_id": "r1",
    "exit_code": 0,
    "empty": {},
    "hosts": {
        "gpu-1": {
            "status": "ok",
            "stages": {"venv": {"status": "ok", "check_s": 0.01}, "none": {}},
            "facts": {"venv": {"python": "3.11", "pkgs": [{"n": 1}, {"n": 2}],
                               "when": WHEN, "quote": 'a "b" \\ c', "ü": "ß"}},
        },
        7: {"status": "failed", "error": None},
    },
}


def test_json_text_reads_back_as_json_dumps_does() -> None:
    for depth in range(6):
        text = json_text(DATA, depth)
        assert json.loads(text) == json.loads(json.dumps(DATA, default=str)), depth


def test_objects_are_indented_to_the_depth_and_deeper_values_are_one_line() -> None:
    lines = json_text(DATA, 4).splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert '  "run_id": "r1",' in lines
    assert '  "empty": {},' in lines  # an empty object stays one token
    assert '      "status": "ok",' in lines  # depth 3: a host's fields
    assert '        "venv": {"status": "ok", "check_s": 0.01},' in lines  # depth 4: one line
    facts = [line for line in lines if line.startswith('        "venv": {"python"')]
    assert len(facts) == 1 and '"pkgs": [{"n": 1}, {"n": 2}]' in facts[0]
    assert '"when": "2026-12-01 00:00:00+00:00"' in facts[0]  # default=str
    assert '    "7": {' in lines  # keys become strings, as in json.dumps
    assert json_text(DATA, 0) == json.dumps(DATA, default=str)


def test_the_run_record_writes_its_summary_with_it(tmp_path: Path) -> None:
    record = RunRecord("r1", "play.yaml", "inv.yaml")
    record.on_host_started(HostStarted(host="gpu-1", stages=["venv"]))
    record.on_stage_finished(StageFinished(host="gpu-1", stage="venv", status="ok",
                                           duration_s=0.02, check_s=0.01,
                                           facts=DATA["hosts"]["gpu-1"]["facts"]["venv"]))
    record.on_host_finished(HostFinished(host="gpu-1", status="ok", duration_s=0.5))
    record.finish(0)
    out = tmp_path / "run" / "summary.json"
    record.write(out)
    assert out.read_text() == json_text(record.summary.to_json(), 4) + "\n"
    assert json.loads(out.read_text())["hosts"]["gpu-1"]["facts"]["venv"]["python"] == "3.11"
    assert not list(out.parent.glob("*.tmp"))


def test_summary_json_keeps_its_keys_and_reads_back_as_the_same_summary(tmp_path: Path) -> None:
    record = RunRecord("r1", "play.yaml", "inv.yaml", dry_run=True)
    record.on_stage_finished(StageFinished(host="gpu-1", stage="venv", status="would-change",
                                           duration_s=0.5, reason="no venv", attempts=1))
    record.finish(0)
    record.write(tmp_path / "summary.json")
    data = json.loads((tmp_path / "summary.json").read_text())
    assert list(data) == ["run_id", "playbook", "inventory", "dry_run", "started_at",
                          "finished_at", "exit_code", "duration_s", "hosts"]
    assert data["hosts"]["gpu-1"] == {
        "status": "pending", "facts": {}, "error": None, "duration_s": None,
        "stages": {"venv": {"status": "would-change", "duration_s": 0.5, "reason": "no venv",
                            "attempts": 1}}}  # a stage's None fields are left out
    assert RunSummary.read(tmp_path / "summary.json") == record.summary
