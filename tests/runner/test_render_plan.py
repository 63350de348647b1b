"""Rendering at plan time: every (host, stage) node rendered for its host, nothing run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
from orchestrator.config import load_all
from orchestrator.errors import ConfigError
from orchestrator.plan import Selection, build_plan, render_plan
from orchestrator.redact import Redactor
from tests.runner.helpers import write_yaml

PLAYBOOK = {
    "name": "templated",
    "vars": {"workdir": "/srv/{{ inventory_hostname }}", "hf_token": "hf_abcdefghijkl"},
    "stages": [
        {"id": "mkdir", "run": "mkdir -p {{ workdir }}", "check": "test -d {{ workdir }}",
         "env": {"TOKEN": "{{ hf_token }}", "PORT": "{{ port }}"}},
        {"id": "big-only", "run": "echo big", "when": "port > 30000", "needs": ["mkdir"]},
        {"id": "uses-shell", "uses": "shell",
         "with": {"command": "touch {{ workdir }}/{{ name }}", "creates": "{{ workdir }}/x"}},
    ],
}
INVENTORY = {
    "hosts": {
        "a": {"connection": "local", "vars": {"port": 30000, "name": "it's a"}},
        "b": {"connection": "local", "vars": {"port": 30001, "name": "b"}},
    },
}


def _plan(tmp_path: Path, playbook: dict = PLAYBOOK):
    pb = write_yaml(tmp_path / "pb.yaml", playbook)
    inv = write_yaml(tmp_path / "inv.yaml", INVENTORY)
    playbook_, inventory = load_all(str(pb), str(inv), {})
    return build_plan(playbook_, inventory, Selection())


def test_nodes_hold_rendered_validated_params_without_running_anything(tmp_path: Path) -> None:
    redactor = Redactor()
    rendered = render_plan(_plan(tmp_path), {}, redactor)

    a = rendered.node("a", "mkdir")
    assert a.params.command == "mkdir -p /srv/a"
    assert a.params.check == "test -d /srv/a"  # run: stages: the shell kind runs check itself
    assert a.check_cmd is None
    assert a.env == {"TOKEN": "hf_abcdefghijkl", "PORT": "30000"}  # env values are strings
    assert a.params.env == a.env
    assert rendered.node("b", "mkdir").params.command == "mkdir -p /srv/b"

    # `when:` evaluated per host: a skipped node has no params, and says why
    skipped = rendered.node("a", "big-only")
    assert skipped.params is None and skipped.skip_reason == "when: port > 30000 is false"
    assert rendered.node("b", "big-only").params.command == "echo big"

    # `with:` validated by the kind's model; command text is shell-quoted, other values not
    shell = rendered.node("a", "uses-shell")
    assert type(shell.params).__name__ == "ShellParams"
    assert shell.params.command == "touch /srv/a/'it'\"'\"'s a'"
    assert shell.params.creates == "/srv/a/x"

    # the secrets to mask: per host, and registered with the run's redactor at once
    assert "hf_abcdefghijkl" in rendered.secrets["a"]
    assert redactor.redact("token hf_abcdefghijkl") != "token hf_abcdefghijkl"


def test_a_template_error_is_a_located_config_error_before_any_host(tmp_path: Path) -> None:
    playbook = {"name": "broken", "vars": {"zero": 0}, "stages": [
        {"id": "ok", "run": "true"},
        {"id": "div", "run": "echo {{ 10 // zero }}"},
    ]}
    plan = _plan(tmp_path, playbook)
    with pytest.raises(ConfigError) as err:
        render_plan(plan, {})
    text = err.value.render()
    assert err.value.exit_code == 2
    assert re.search(re.escape(str(tmp_path / "pb.yaml")) + r":\d+:\d+: ", text), text
    assert "ZeroDivisionError" in text
    # one problem, though both hosts have the node: problems are collected and deduplicated
    assert len(err.value.problems) == 1
