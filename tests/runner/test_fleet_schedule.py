"""Which schedule a deploy gets (orchestrator.run.fleet.schedule): the fleet's, with its gate on
RunState, whenever the plan holds a gateway stage; a plain one without; a refusal when the
selection would restart servers behind a gateway it leaves out."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import PlanError
from orchestrator.options import RunOptions

PLAYBOOK = """
name: fleet
hosts: replicas
stages:
  - id: prepare
    run: "true"
  - id: server
    needs: [prepare]
    uses: sglang_server
    with: {python: /v/bin/python, model_path: /m, state_dir: /s}
  - id: gateway
    hosts: lb
    uses: gateway
    with: {python: /v/bin/python, worker_group: replicas, state_dir: /g}
"""
INVENTORY = """
hosts:
  a: {connection: local}
  b: {connection: local, address: 127.0.0.2}
  c: {connection: local}
  lb: {connection: local}
groups:
  replicas: {hosts: [a, b, c]}
"""


def _schedule(tmp_path: Path, playbook: str = PLAYBOOK, **selection: list[str]) -> object:
    from orchestrator.config import load_all
    from orchestrator.events import EventBus
    from orchestrator.plan import Selection, build_plan, render_plan
    from orchestrator.run.fleet import schedule
    from orchestrator.run.state import RunState

    (tmp_path / "p.yaml").write_text(playbook)
    (tmp_path / "i.yaml").write_text(INVENTORY)
    pb, inv = load_all(str(tmp_path / "p.yaml"), str(tmp_path / "i.yaml"), {})
    plan = build_plan(pb, inv, Selection.from_args(selection.get("limit"),
                                                   selection.get("only"), None, None))
    state = RunState(render_plan(plan), EventBus("test"), options=RunOptions())
    return schedule(state)


def test_a_plan_with_a_gateway_gets_the_fleet_schedule_and_its_gate(tmp_path: Path) -> None:
    from orchestrator.run.fleet import FleetRun

    run = _schedule(tmp_path)
    assert isinstance(run, FleetRun)
    gate = run.gate
    assert run.state.gate is gate
    assert gate.gateway_host == "lb" and gate.max_unavailable == 1
    assert gate.urls == {"a": "http://a:30000", "b": "http://127.0.0.2:30000",
                         "c": "http://c:30000"}
    assert gate.wait_for == {"a", "b", "c", "lb"}  # the barrier: replicas and the gateway host


def test_without_a_gateway_a_plain_schedule(tmp_path: Path) -> None:
    from orchestrator.run.parallel import ParallelRun

    without = PLAYBOOK.split("  - id: gateway")[0]
    assert isinstance(_schedule(tmp_path, without), ParallelRun)


def test_restarting_servers_without_their_gateway_is_refused(tmp_path: Path) -> None:
    from orchestrator.run.parallel import ParallelRun

    with pytest.raises(PlanError, match="restarts servers .*server.* behind the gateway stage "
                       "'gateway' but leaves that stage out"):
        _schedule(tmp_path, limit=["a"])
    with pytest.raises(PlanError, match="leaves that stage out"):
        _schedule(tmp_path, only=["server"])
    # a selection that restarts no server needs no gate
    assert isinstance(_schedule(tmp_path, only=["prepare"]), ParallelRun)


def test_two_gateways_are_refused(tmp_path: Path) -> None:
    two = PLAYBOOK + """
  - id: gateway2
    hosts: lb
    uses: gateway
    with: {python: /v/bin/python, worker_group: replicas, state_dir: /g2, port: 30090}
"""
    with pytest.raises(PlanError, match="one gateway stage on one host; found 2"):
        _schedule(tmp_path, two)
