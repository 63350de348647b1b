"""Connections opened while a deploy is being prepared (orchestrator.preconnect): the hosts opened
early are the plan's own, the runner uses them instead of connecting again, and what nobody
claims is closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import orchestrator.stages  # noqa: F401 - the stage kinds, for load_all
from orchestrator.config import load_all, load_inventory
from orchestrator.config.model import HostSpec
from orchestrator.plan import Selection, build_plan
from orchestrator.preconnect import Preconnect, early_hosts
from orchestrator.transports import make_transport
from tests.runner.helpers import cli, local_inventory, write_yaml
from tests.sshd import SSHServer

INVENTORY = {
    "hosts": {
        "gpu-1": {"address": "127.0.0.1", "groups": ["gpu"]},
        "gpu-2": {"address": "127.0.0.1", "groups": ["gpu"]},
        "pve-1": {"address": "127.0.0.1", "groups": ["hv"]},
        "db-1": {"address": "127.0.0.1"},
    },
}


def _stage(sid: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "run": "true", **extra}


CASES = {
    "the playbook's group": ({"hosts": "gpu", "stages": [_stage("a")]}, None),
    "a stage's own hosts": ({"hosts": "gpu", "stages": [_stage("a"),
                                                        _stage("b", hosts=["hv"])]}, None),
    "every stage names its hosts": ({"hosts": "gpu", "stages": [_stage("a", hosts="db-1")]},
                                    None),
    "no hosts anywhere": ({"stages": [_stage("a")]}, None),
    "a stage without hosts, the playbook without": (
        {"stages": [_stage("a", hosts="gpu"), _stage("b")]}, None),
    "--limit": ({"hosts": "gpu", "stages": [_stage("a")]}, ["gpu-2,pve-1"]),
    "--limit a pattern": ({"stages": [_stage("a")]}, ["*-1"]),
}


@pytest.mark.parametrize("case", CASES)
def test_the_hosts_opened_early_are_the_plans(case: str, tmp_path: Path) -> None:
    playbook, limit = CASES[case]
    pb_path = write_yaml(tmp_path / "pb.yaml", {"name": "p", **playbook})
    inv_path = write_yaml(tmp_path / "inv.yaml", INVENTORY)
    pb, inv = load_all(str(pb_path), str(inv_path))
    selection = Selection.from_args(limit, None, None, None)
    plan = build_plan(pb, inv, selection)
    assert early_hosts(str(pb_path), load_inventory(inv_path), selection.limit) == plan.hosts


@pytest.mark.parametrize("hosts", ["{{ target }}", ["gpu", "{{ more }}"], {"a": 1}])
def test_hosts_that_are_not_plain_names_open_nothing_early(hosts: Any, tmp_path: Path) -> None:
    pb_path = write_yaml(tmp_path / "pb.yaml", {"name": "p", "hosts": hosts,
                                                "stages": [_stage("a")]})
    inv = load_inventory(write_yaml(tmp_path / "inv.yaml", INVENTORY))
    assert early_hosts(str(pb_path), inv, None) == []
    assert early_hosts(str(tmp_path / "missing.yaml"), inv, None) == []
    assert early_hosts(str(tmp_path / "inv.yaml"), inv, None) == []  # no stages: not a playbook
    assert early_hosts(str(pb_path.with_name("x")), inv, ["nope-*"]) == []


def test_the_runner_claims_early_connections_and_the_rest_are_closed(tmp_path: Path) -> None:
    specs = [HostSpec(name=n, connection="local", lock_path=str(tmp_path / f"{n}.lock"))
             for n in ("a", "b")]
    waits: list[tuple[int, float, BaseException]] = []
    early = Preconnect(specs, make_transport, budget=lambda spec: 10.0)
    try:
        assert sorted(early.hosts) == ["a", "b"]
        fut = early.claim("a", lambda *w: waits.append(w))
        assert fut is not None
        a = fut.result(timeout=60)
        assert a.connected and a.probe("python")["version_info"][0] == 3
        assert early.claim("a", lambda *w: None) is None  # claimed once
        b_fut = early._pending["b"]
        b = b_fut.result(timeout=60)
        assert b.connected
    finally:
        early.close()
    assert not b.connected  # nobody claimed it: closed
    assert a.connected  # the claimer's to close
    assert early.claim("b", lambda *w: None) is None
    assert waits == []
    a.close()


def test_a_deploy_opens_one_connection_per_host(ssh_server: SSHServer, tmp_path: Path) -> None:
    """The connection opened early is the one the stages use: sshd accepts one login."""
    spec = ssh_server.host_spec().model_dump(exclude={"name"}, exclude_defaults=True)
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {"h1": spec}})
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "p", "stages": [
        _stage("a"), _stage("b", needs=["a"])]})
    r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert r.statuses("h1") == {"a": "changed", "b": "changed"}
    log = ssh_server.log_file.read_text()
    assert log.count("Accepted publickey") == 1, log


@pytest.mark.parametrize("flag", ["only", "skip", "from_"])
def test_no_early_connection_for_a_stage_selection(flag: str, tmp_path: Path) -> None:
    """--only/--skip/--from may drop hosts: nothing is opened before the plan says which."""
    from orchestrator.deploy import _preconnect
    from orchestrator.options import RunOptions

    inv = local_inventory(tmp_path / "inv.yaml", ("l1",))
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "p", "stages": [_stage("a"), _stage("b")]})
    args: dict[str, Any] = {"limit": None, "only": None, "from_": None, "skip": None}
    args[flag] = "b" if flag == "from_" else ["b"]
    picked = Selection.from_args(args["limit"], args["only"], args["from_"], args["skip"])
    assert _preconnect(str(pb), str(inv), picked, RunOptions(), None) is None
    plain = Selection.from_args(None, None, None, None)
    early = _preconnect(str(pb), str(inv), plain, RunOptions(), None)
    assert early is not None and early.hosts == ["l1"]
    early.close()
    assert _preconnect(str(pb), str(inv), plain, RunOptions(preconnect=False), None) is None
