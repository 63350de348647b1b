"""Ansible users' habits: `deploy --check` (a dry run), `--diff`, `--list-hosts`, `--list-tasks`,
`-V`, a warning for a typo'd `--var`, and validate counting hypervisors apart."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.console import diff_lines
from orchestrator.cli.main import main
from orchestrator.summary import RunSummary
from tests.runner.helpers import cli, local_inventory, write_yaml


def test_short_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("-V", "--version"):
        with pytest.raises(SystemExit) as ex:
            main([flag])
        assert ex.value.code == 0
        assert capsys.readouterr().out.startswith("orchestrator ")


def _two_stage_playbook(tmp_path: Path, target: Path) -> Path:
    return write_yaml(tmp_path / "pb.yaml", {
        "name": "diff", "vars": {"target": str(target), "sglang_port": 30000},
        "stages": [
            {"id": "same", "run": "true", "check": "true"},
            {"id": "mk", "run": "mkdir -p {{ target }}", "check": "test -d {{ target }}"},
        ],
    })


def test_check_is_a_dry_run_and_diff_names_what_would_change_and_why(tmp_path: Path) -> None:
    target = tmp_path / "made"
    pb, inv = _two_stage_playbook(tmp_path, target), local_inventory(tmp_path / "inv.yaml")
    r = cli("deploy", str(pb), "-i", str(inv), "--check", "--diff", runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert r.summary["dry_run"] is True and not target.exists()
    assert r.statuses("localhost") == {"same": "ok", "mk": "would-change"}
    diff = r.stdout[r.stdout.index("diff:"):].splitlines()
    assert diff[0] == "diff: 1 stage run(s) would change:"
    assert diff[1] == "  mk on localhost: check exited 1"  # the converged stage is not listed
    assert not any("same on" in line for line in diff)
    assert "would-change" in r.stdout and "run record:" in r.stdout

    # --diff alone: the deploy runs, and says what it changed and why
    r = cli("deploy", str(pb), "-i", str(inv), "--diff", runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert target.is_dir()
    assert "diff: 1 stage run(s) changed:\n  mk on localhost: check exited 1" in r.stdout

    # converged now; with --json the reasons are in the summary itself
    r = cli("plan", str(pb), "-i", str(inv), "--diff", "--json", runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    stages = json.loads(r.stdout)["hosts"]["localhost"]["stages"]
    assert {s["status"] for s in stages.values()} == {"ok"}
    assert "reason" in stages["mk"]


def test_diff_without_it_prints_nothing_extra(tmp_path: Path) -> None:
    pb = _two_stage_playbook(tmp_path, tmp_path / "made")
    r = cli("plan", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")),
            runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    assert "diff:" not in r.stdout


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that counts as a host: whoever connects is seen by accept()."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _fleet(tmp_path: Path, port: int) -> tuple[Path, Path]:
    inv = write_yaml(tmp_path / "inv.yaml", {
        "defaults": {"address": "127.0.0.1", "port": port, "user": "ops",
                     "connect_timeout": "1s"},
        "hosts": {"gpu-1": {"groups": ["gpu"]}, "gpu-2": {"groups": ["gpu"]},
                  "gw": {"address": "127.0.0.9", "port": None, "user": None}},
    })
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "fleet", "vars": {"sglang_port": 30000},
        "stages": [
            {"id": "health", "run": "true", "tags": ["setup"]},
            {"id": "server", "run": "echo {{ sglang_port }}", "needs": ["health"],
             "hosts": ["gpu"]},
            {"id": "gateway", "run": "true", "needs": ["health"], "hosts": ["gw"]},
            {"id": "pre", "run": "true"},
        ],
    })
    return pb, inv


def test_list_hosts_names_each_host_and_its_address_without_connecting(
        tmp_path: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    pb, inv = _fleet(tmp_path, listener.getsockname()[1])
    port = listener.getsockname()[1]
    for cmd in ("deploy", "plan"):
        assert main([cmd, str(pb), "-i", str(inv), "--list-hosts"]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"gpu-1  ops@127.0.0.1:{port}", f"gpu-2  ops@127.0.0.1:{port}", "gw     127.0.0.9"]
    assert main(["deploy", str(pb), "-i", str(inv), "--list-hosts", "--limit", "gpu"]) == 0
    assert capsys.readouterr().out.split() == [
        "gpu-1", f"ops@127.0.0.1:{port}", "gpu-2", f"ops@127.0.0.1:{port}"]
    assert main(["deploy", str(pb), "-i", str(inv), "--list-hosts", "--json"]) == 0
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert [h["name"] for h in hosts] == ["gpu-1", "gpu-2", "gw"]
    with pytest.raises(BlockingIOError):
        listener.accept()  # no one connected


def test_list_tasks_in_run_order_per_host_where_they_differ(
        tmp_path: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    pb, inv = _fleet(tmp_path, listener.getsockname()[1])
    assert main(["plan", str(pb), "-i", str(inv), "--list-tasks"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 stage(s) on gpu-1, gpu-2:"
    assert [line.split()[1] for line in out[1:4]] == ["health", "server", "pre"]
    assert "needs: health" in out[2] and "tags: setup" in out[1]
    assert out[4] == "3 stage(s) on gw:"
    assert [line.split()[1] for line in out[5:8]] == ["health", "gateway", "pre"]

    argv = ["deploy", str(pb), "-i", str(inv), "--list-tasks", "--skip", "pre", "--limit", "gpu-2"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 stage(s) on gpu-2:" and len(out) == 3
    assert main([*argv, "--only", "server", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"hosts": {"gpu-2": ["server"]}}
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_list_tasks_gives_a_bad_selection_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb, inv = _fleet(tmp_path, 22)
    assert main(["deploy", str(pb), "-i", str(inv), "--list-tasks", "--only", "srever"]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_an_unknown_var_is_warned_once_with_the_nearest_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pb, inv = _fleet(tmp_path, 22)
    assert main(["validate", str(pb), "-i", str(inv), "--var", "sglang_prot=30001"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("warning: --var sglang_prot:")
    assert err[0].endswith("(did you mean sglang_port?)")
    assert main(["validate", str(pb), "-i", str(inv), "--var", "sglang_port=30001"]) == 0
    assert capsys.readouterr().err == ""
    # a name only a template reads (nothing defines it but --var) is known too
    write_yaml(pb, {"name": "t", "stages": [{"id": "a", "run": "echo {{ site }}"}]})
    assert main(["validate", str(pb), "-i", str(inv), "--var", "site=x"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["deploy", str(pb), "-i", str(inv), "--var", "site=x", "--var", "zzz=1",
                 "--list-hosts"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: --var zzz: no vars define it and no template reads it"]


def test_an_unknown_var_is_warned_on_deploy_and_the_run_goes_on(tmp_path: Path) -> None:
    pb = _two_stage_playbook(tmp_path, tmp_path / "made")
    r = cli("plan", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")),
            "--var", "sglang_prot=30001", "--var", "sglang_port=1", runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: --var sglang_prot: no vars define it and no template reads "
                        "it (did you mean sglang_port?)"]


def test_validate_counts_hypervisors_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {
        "ct-1": {"address": "10.0.0.1", "hypervisor": {"host": "pve", "ctid": 101}},
        "ct-2": {"address": "10.0.0.2", "hypervisor": {"host": "pve", "ctid": 102}},
        "pve": {"address": "10.0.0.9"},
    }})
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "t", "hosts": ["ct-1", "ct-2"],
                                           "stages": [{"id": "a", "run": "true"}]})
    assert main(["validate", str(pb), "-i", str(inv)]) == 0
    assert capsys.readouterr().out == f"ok: {pb}: 1 stage(s), 2 deploy host(s), 1 hypervisor\n"
    plain = write_yaml(tmp_path / "plain.yaml",
                       {"name": "t", "stages": [{"id": "a", "run": "true"}]})
    inv = local_inventory(tmp_path / "local.yaml", ("a", "b"))
    assert main(["validate", str(plain), "-i", str(inv)]) == 0
    assert capsys.readouterr().out == f"ok: {plain}: 1 stage(s), 2 host(s)\n"


def test_diff_lines_group_hosts_by_stage_and_reason() -> None:
    """A fleet's --diff stays short: one line per (stage, reason), the hosts named (6 at most)."""
    hosts: dict[str, Any] = {}
    for i in range(1, 10):
        server = {"status": "would-change", "reason": "launch fingerprint differs\n(port)"} \
            if i != 3 else {"status": "ok", "reason": "running"}
        health = {"status": "would-change", "reason": "uvm rule"} if i == 2 else \
            {"status": "ok"}
        hosts[f"gpu-{i}"] = {"stages": {"health": health, "server": server}}
    summary = RunSummary.from_json({"run_id": "r", "playbook": "p", "inventory": "i",
                                    "dry_run": True, "hosts": hosts})
    assert diff_lines(summary) == [
        "diff: 9 stage run(s) would change:",
        "  health on gpu-2: uvm rule",
        "  server on gpu-1, gpu-2, gpu-4, gpu-5, gpu-6, gpu-7 and 2 more: "
        "launch fingerprint differs / (port)",
    ]
    converged = RunSummary.from_json({"run_id": "r", "playbook": "p", "inventory": "i",
                                      "hosts": {"a": {"stages": {"s": {"status": "ok"}}}}})
    assert diff_lines(converged) == ["diff: nothing changed"]
