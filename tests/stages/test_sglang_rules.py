"""The pure rules of sglang_server (and its pin), wait_ready and the service commands, driven
from tables.

tests/stages/sglang_rules/<rule>.json: {"rule": "<name below>", "cases": [{"name", "in", "out"}]}.
A case's inputs are plain data; a server status is named by a recorded answer
(tests/facts/server_status/<case>.json) with an optional deep-merged "patch" of that answer.
No host is needed (pyinfra: tests/operations/*.json).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.model import HostSpec
from orchestrator.errors import StageError
from orchestrator.facts import to_data
from orchestrator.facts.hardware import GpuHealth, GpuUser
from orchestrator.facts.http import HttpAnswer
from orchestrator.facts.server import ExitRecord, Listener, PidFile, ServerStatus, SystemdInfo
from orchestrator.service import LaunchRecord, ServiceTarget, status_row
from orchestrator.stages.sglang_server import SGLangServerParams
from orchestrator.stages.sglang_server import rules as server_rules
from orchestrator.stages.sglang_server.change import launch_spec
from orchestrator.stages.sglang_server.layout import ServerLayout
from orchestrator.stages.sglang_server.reads import Desired, launch_gpus
from orchestrator.stages.sglang_server.rules import ServerPin
from orchestrator.stages.wait_ready import rules as ready_rules
from orchestrator.stages.wait_ready.rules import ReadyMarker

HERE = Path(__file__).resolve().parent / "sglang_rules"
FACTS = Path(__file__).resolve().parents[1] / "facts"


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base.get(k), v)
        return out
    return copy.deepcopy(patch)


def recorded(probe: str, case: str) -> Any:
    """The answer recorded in tests/facts/<probe>/<case>.json."""
    return json.loads((FACTS / probe / f"{case}.json").read_text())["answer"]


def status(inp: dict[str, Any]) -> ServerStatus:
    """The case's server status: a recorded answer, patched."""
    return ServerStatus.from_answer(_merge(recorded("server_status", inp["status"]),
                                           inp.get("patch") or {}))


def _want(inp: dict[str, Any], st: ServerStatus) -> dict[str, Any]:
    """The wanted fingerprint: the running server's ("same"), or the recorded one patched."""
    base = recorded("server_status", "running_healthy")["fingerprint"]
    want = inp.get("want", "same")
    if want == "same":
        return dict(st.fingerprint or base)
    return _merge(base, want)


def _error(exc: StageError | None) -> Any:
    return None if exc is None else {"message": exc.message, "hint": exc.hint}


def _launch_mode(i: dict[str, Any]) -> Any:
    info = None if i.get("info") is None else SystemdInfo.from_answer(i["info"])
    try:
        return server_rules.launch_mode(i["systemd"], info)
    except StageError as exc:
        return {"error": _error(exc)}


def _status_row(i: dict[str, Any]) -> Any:
    target = ServiceTarget(name="gpu-1", spec=HostSpec(name="gpu-1", connection="local"),
                           state_dir="/opt/orchestrator/run", port=i.get("port", 30000))
    row = status_row(target, status(i), LaunchRecord(**i.get("launch", {})))
    return {k: row[k] for k in ("state", "detail", "ready", "pid", "managed_by", "model")}


def _launch_spec(i: dict[str, Any]) -> Any:
    p = SGLangServerParams.model_validate(i["params"])
    desired = Desired(i["args"], i["env"], {"fingerprint": i["fingerprint"]})
    key_file = ServerLayout(p.state_dir).api_key if p.api_key else None
    return launch_spec(p, ServerLayout(p.state_dir), desired, i["mode"], key_file)


RULES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "launch_spec": _launch_spec,
    "server_verdict": lambda i: to_data(server_rules.server_verdict(
        st := status(i), _want(i, st), port=i.get("port", 30000),
        restart_after=i.get("restart_after", 3600.0))),
    "other_gpu_users": lambda i: server_rules.other_gpu_users(
        status(i), [GpuUser.from_answer(p) for p in i["processes"]],
        stop_stale=i.get("stop_stale", False)),
    "stale_refusal": lambda i: _error(server_rules.stale_refusal(
        Listener.parse(i["listener"]), [GpuUser.from_answer(p) for p in i.get("held", [])],
        bind=i.get("bind", "127.0.0.1"), port=i.get("port", 30000),
        stop_stale=i.get("stop_stale", False))),
    "launch_mode": _launch_mode,
    "pin_drift": lambda i: server_rules.pin_drift(ServerPin.from_json(i["entry"]),
                                                ServerPin.from_json(i["pin"])),
    "version_drift": lambda i: to_data(server_rules.version_drift(i["have"], i["want"],
                                                                dry_run=i["dry_run"])),
    "started_too_soon": lambda i: server_rules.started_too_soon(status(i), i.get("pid")),
    "fmt_cmd": lambda i: server_rules.fmt_cmd(i["argv"], i.get("limit", 160)),
    "launch_gpus": lambda i: to_data(launch_gpus(GpuHealth.from_answer(
        recorded("gpu_facts", i["gpu_facts"]) if isinstance(i["gpu_facts"], str)
        else i["gpu_facts"]))),
    "health_state": lambda i: ready_rules.health_state(HttpAnswer.from_answer(
        recorded("http", i["http"]) if isinstance(i["http"], str) else i["http"])),
    "exit_how": lambda i: ready_rules.exit_how(ExitRecord.parse(i["exit"])),
    "accept_verdict": lambda i: list(ready_rules.accept_verdict(i["live"], i["verified"],
                                                                i["floor"])),
    "arch_problem": lambda i: ready_rules.arch_problem(i["want"], i["info"]),
    "accept_message": lambda i: ready_rules.accept_message(
        i["info"], i["accept"], floor=i["floor"], requests=i["requests"],
        drafter_archs=i["drafter_archs"]),
    "needs_drafter_archs": lambda i: ready_rules.needs_drafter_archs(i["info"]),
    "ready_marker": lambda i: (m := ReadyMarker.parse(i["marker"])) is not None and m.names(
        PidFile.parse(i["pidfile"])),
    "status_row": _status_row,
}

CASES = [(path, case) for path in sorted(HERE.glob("*.json"))
         for case in json.loads(path.read_text())["cases"]]


def test_every_rule_has_a_table() -> None:
    tables = {json.loads(p.read_text())["rule"] for p in HERE.glob("*.json")}
    assert tables == set(RULES)


@pytest.mark.parametrize(("path", "case"), CASES,
                         ids=[f"{p.stem}/{c['name']}" for p, c in CASES])
def test_rule_table(path: Path, case: dict[str, Any]) -> None:
    rule = json.loads(path.read_text())["rule"]
    assert RULES[rule](case["in"]) == case["out"]
