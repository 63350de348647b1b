"""`vars_files:` merges YAML files of variables over a playbook's `vars:`, keeping locations."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import host_variables, load_all
from orchestrator.errors import ConfigError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    return _write(tmp_path / "inv.yaml", "hosts:\n  h1: {connection: local, vars: {d: host}}\n")


def test_files_override_playbook_vars_and_hosts_override_files(tmp_path: Path, inv: Path) -> None:
    _write(tmp_path / "models/m.yaml", "b: file\nd: file\nrepo: {name: x, rev: '{{ a }}'}\n")
    _write(tmp_path / "models/n.yaml", "c: second\nb: second-file\n")
    pb = _write(tmp_path / "pb.yaml", "name: t\nvars_files: [models/m.yaml, models/n.yaml]\n"
                "vars: {a: 1, b: pb, c: pb}\nstages: [{id: s, run: 'echo {{ repo.rev }}'}]\n")
    playbook, inventory = load_all(pb, inv)
    v = host_variables(playbook, inventory, "h1", {})
    assert (v["a"], v["b"], v["c"], v["d"]) == (1, "second-file", "second", "host")
    assert v["repo"] == {"name": "x", "rev": 1}


def test_errors_in_a_vars_file_name_that_file(tmp_path: Path, inv: Path) -> None:
    _write(tmp_path / "m.yaml", "ok: 1\nbad: '{{ undefined_thing }}'\n")
    pb = _write(tmp_path / "pb.yaml", "name: t\nvars_files: [m.yaml, missing.yaml]\n"
                "stages: [{id: s, run: 'echo {{ bad }}'}]\n")
    with pytest.raises(ConfigError) as err:
        load_all(pb, inv)
    text = err.value.render()
    assert "m.yaml:2:" in text and "undefined_thing" in text
    assert "pb.yaml:2:" in text and "missing.yaml" in text


def test_top_level_extension_keys_hold_anchors(tmp_path: Path, inv: Path) -> None:
    pb = _write(tmp_path / "pb.yaml", "name: t\nx-retry: &r {attempts: 4, on: [connection]}\n"
                "stages:\n  - {id: a, run: 'true', retry: *r}\n")
    playbook, _ = load_all(pb, inv)
    assert playbook.stages[0].retry is not None and playbook.stages[0].retry.attempts == 4
