"""Connections opened while a deploy is being prepared (orchestrator.preconnect): the hosts opened
early are the plan's own, read early they are reached as the loaded inventory says, the runner
uses them instead of connecting again (unless they were opened otherwise), and what nobody
claims is closed."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchestrator.stages  # noqa: F401 - the stage kinds, for load_all
from orchestrator import logs
from orchestrator.config import load_all, load_inventory
from orchestrator.config.model import HostSpec
from orchestrator.plan import Selection, build_plan
from orchestrator.preconnect import Preconnect, _reached_as, early_hosts, read_inventory
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
    read = read_inventory(str(inv_path))
    assert read is not None
    assert early_hosts(str(pb_path), read[0], selection.limit) == plan.hosts


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
        fut = early.claim("a", specs[0], lambda *w: waits.append(w))
        assert fut is not None
        a = fut.result(timeout=60)
        assert a.connected and a.probe("python")["version_info"][0] == 3
        assert a.spec is specs[0]
        assert early.claim("a", specs[0], lambda *w: None) is None  # claimed once
        b_fut = early._pending["b"]
        b = b_fut.result(timeout=60)
        assert b.connected
    finally:
        early.close()
    assert not b.connected  # nobody claimed it: closed
    assert a.connected  # the claimer's to close
    assert early.claim("b", specs[1], lambda *w: None) is None
    assert waits == []
    a.close()


def test_a_connection_opened_otherwise_than_the_validated_host_says_is_not_used(
        tmp_path: Path) -> None:
    """The early read and validation disagree about how to reach a host: the runner gets no
    early connection (it connects as the validated inventory says), and the early one is
    closed."""
    lock = str(tmp_path / "a.lock")
    early = Preconnect([HostSpec(name="a", connection="local")], make_transport,
                       budget=lambda spec: 10.0)
    try:
        fut = early._pending["a"]
        validated = HostSpec(name="a", connection="local", lock_path=lock, connect_timeout=3)
        assert early.claim("a", validated, lambda *w: None) is None
        transport = fut.result(timeout=60)
        assert not transport.connected
        assert early.hosts == []
    finally:
        early.close()


RAW_INVENTORY = """
defaults:
  user: deploy
  port: 2222
  connect_timeout: 5s
  identity_file: ~/.ssh/id_ed25519
  vars: {token: !env HF_TOKEN}
hosts:
  gpu-1: {address: 10.0.0.1, groups: gpu}
  gpu-2: {address: 10.0.0.2, port: 22, connect_budget: 2m, host_key_policy: accept-new}
  gpu-3: {address: "{{ ip }}"}
  gpu-4: {address: !env GPU4_ADDRESS}
  gpu-5: {address: 10.0.0.5, port: "22"}
  gpu-6: {connection: local, wait_for_host: 1m}
  gpu-7:
groups:
  hv: {hosts: gpu-2}
  all-gpu: {hosts: [gpu-1, gpu-2]}
"""


def test_the_early_read_reaches_each_host_as_loading_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read early, a host's settings equal the loaded ones (`defaults:` applied, durations
    parsed, a port written as text taken as the loader takes it); a setting that only loading
    can tell (a template, a tag) leaves that host to the runner; groups resolve the same."""
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.setenv("GPU4_ADDRESS", "10.0.0.4")
    path = tmp_path / "inv.yaml"
    path.write_text(RAW_INVENTORY)
    read = read_inventory(str(path))
    assert read is not None
    early, plain = read
    inv = load_inventory(path)
    assert list(early.hosts) == list(inv.hosts)
    assert sorted(set(early.hosts) - plain) == ["gpu-3", "gpu-4"]
    for name in plain:
        assert _reached_as(early.hosts[name]) == _reached_as(inv.hosts[name]), name
    assert early.hosts["gpu-5"].port == 22
    gpu_2 = HostSpec(name="gpu-2", address="10.0.0.2", port=22, user="deploy",
                     identity_file="~/.ssh/id_ed25519", connect_timeout=5.0,
                     connect_budget=120.0, host_key_policy="accept-new")
    assert _reached_as(early.hosts["gpu-2"]) == _reached_as(gpu_2)
    for group in ("gpu", "hv", "all-gpu"):
        assert early.group_members(group) == inv.group_members(group), group
    assert early.group_names() == inv.group_names()


@pytest.mark.parametrize("text", [
    "[gpu]\ngpu-1 ansible_host=10.0.0.1\n",  # an Ansible INI inventory
    "all:\n  hosts:\n    gpu-1: {ansible_host: 10.0.0.1}\n",  # an Ansible YAML one
    "hosts: [gpu-1]\n",
    "hosts:\n  gpu-1: {address: [1\n",  # not YAML
])
def test_an_inventory_not_plainly_ours_is_left_to_the_loader(text: str, tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    assert read_inventory(str(path)) is None
    assert read_inventory(str(tmp_path / "missing.yaml")) is None


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
    from orchestrator.options import RunOptions
    from orchestrator.preconnect import for_deploy

    inv = local_inventory(tmp_path / "inv.yaml", ("l1",))
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "p", "stages": [_stage("a"), _stage("b")]})
    args: dict[str, Any] = {"limit": None, "only": None, "from_": None, "skip": None}
    args[flag] = "b" if flag == "from_" else ["b"]
    picked = Selection.from_args(args["limit"], args["only"], args["from_"], args["skip"])
    assert for_deploy(str(pb), str(inv), picked, RunOptions()) is None
    plain = Selection.from_args(None, None, None, None)
    early = for_deploy(str(pb), str(inv), plain, RunOptions())
    assert early is not None and early.hosts == ["l1"]
    early.close()
    assert for_deploy(str(pb), str(inv), plain, RunOptions(preconnect=False)) is None


def test_what_an_early_connection_logs_before_the_run_goes_to_the_run(
        ssh_server: SSHServer) -> None:
    """The connection opens, and logs "connected", before the run's log exists: the line is
    held and handed to the run's sink when it is set (not printed on stdout, where --json
    goes, as structlog's defaults would)."""
    lines: list[dict[str, Any]] = []
    spec = ssh_server.host_spec(name="h1")
    early = Preconnect([spec], make_transport, budget=lambda spec: 30.0)
    try:
        fut = early.claim("h1", spec, lambda *w: None)
        assert fut is not None
        transport = fut.result(timeout=60)
        logs.configure(lines.append)
        assert [line["host"] for line in lines if line["event"] == "connected"] == ["h1"]
        transport.close()
    finally:
        early.close()
        logs.configure(None)


#: imported by a deploy only after its first connection has started
LATE = ("jinja2", "rich", "structlog", "orchestrator.config.loader", "orchestrator.plan",
        "orchestrator.events", "orchestrator.deploy", "orchestrator.cli.console",
        "orchestrator.stages", "orchestrator.run")


def test_the_way_to_the_first_connection_imports_nothing_it_does_not_need(
        tmp_path: Path) -> None:
    """In a fresh interpreter, at the moment the first connection starts (socket.connect, PEP
    578 audit hook): what `orchestrator deploy` runs before it (the command line, the
    inventory's hosts validated and the playbook read raw, the early hosts picked, the transport
    made) leaves the loader, templating, the console, structlog, the run record and the stages
    unimported."""
    with socket.socket() as s:  # a loopback port nobody listens on: the connect is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = write_yaml(tmp_path / "inv.yaml", {
        "hosts": {"gpu-1": {"address": "127.0.0.1", "port": port}},
        "vars": {"plain": "text", "n": 8}})
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "p", "hosts": "gpu-1", "vars": {
        "x": "{{ plain }}"}, "stages": [_stage("a", run="echo {{ x }}")]})
    code = f"""
import sys, threading
seen, mods = threading.Event(), []
def hook(event, args):
    if event == "socket.connect" and not seen.is_set():
        mods.extend(sys.modules)
        seen.set()
sys.addaudithook(hook)
from orchestrator.cli.main import build_parser
from orchestrator.config.durations import parse_duration
from orchestrator.options import RunOptions
from orchestrator.preconnect import for_deploy
from orchestrator.selection import Selection

args = build_parser("deploy").parse_args(["deploy", {str(pb)!r}, "-i", {str(inv)!r}])
options = RunOptions(wait_for_host=parse_duration(args.wait_for_host))
selection = Selection.from_args(args.limit, args.only, args.from_, args.skip)
early = for_deploy(args.playbook, args.inventory, selection, options)
assert early is not None and early.hosts == ["gpu-1"], early
assert seen.wait(60)
print("connected-with", " ".join(m for m in {LATE!r} if m in mods))
early.close()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["connected-with"]
