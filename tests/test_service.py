"""A deploy through the real CLI on a simulated host, then `status`, `logs` (-f) and `stop`.

The deploy runs `python -m orchestrator deploy` (runner, SSH transport, run record); the
operator commands are driven through `orchestrator.cli.service_cmds.add_subcommands` on a fresh
argparse parser, exactly as the CLI registers them.
"""
# ruff: noqa: F811 - pytest fixtures imported from tests.sglang.simhost

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import structlog
import yaml

from orchestrator.cli.service_cmds import add_subcommands
from orchestrator.config.model import StageSpec
from orchestrator.errors import ConfigError
from orchestrator.service import follow_logs, resolve_targets
from orchestrator.stages.base import StageContext, stage_kinds
from tests.runner.helpers import cli
from tests.sglang.simhost import (  # noqa: F401 - fixtures
    API_KEY,
    SGLangSim,
    cmdlines_with,
    sglang_sim,
    stop_servers_after,
    wait_for,
)


def playbook(sim: SGLangSim, path: Path) -> Path:
    doc = {
        "name": "serve-kimi",
        "vars": {"venv_python": sim.python, "api_key": "!ENV"},
        "secrets": ["api_key"],
        "stages": [
            {"id": "server", "uses": "sglang_server", "with": {
                "python": "{{ venv_python }}", "model_path": "{{ base_dir }}/models/k26",
                "draft_model_path": "{{ base_dir }}/models/drafter", "tp": 8,
                "speculative": {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                                "num_draft_tokens": 4},
                "host": "{{ sglang_host }}", "port": "{{ sglang_port }}",
                "served_model_name": "kimi-k2.6", "tool_call_parser": "kimi_k2",
                "reasoning_parser": "kimi_k2", "mem_fraction_static": 0.88,
                "api_key": "{{ api_key }}", "env": {"NCCL_P2P_LEVEL": "SYS"},
                "state_dir": "{{ base_dir }}/run", "verify_window": 0.3, "stop_timeout": 5}},
            {"id": "ready", "uses": "wait_ready", "needs": ["server"], "with": {
                "url": "http://{{ sglang_host }}:{{ sglang_port }}", "api_key": "{{ api_key }}",
                "timeout": "30s", "poll_interval": 0.2, "state_dir": "{{ base_dir }}/run",
                "expect_architectures": ["KimiK25ForConditionalGeneration"],
                "min_accept_length": 1.2}},
        ],
    }
    text = yaml.safe_dump(doc, sort_keys=False).replace("'!ENV'", "!env SGLANG_API_KEY")
    path.write_text(text)
    return path


def run(*argv: str) -> int:
    """Run a command as the CLI would; the logging it configures is restored afterwards."""
    parser = argparse.ArgumentParser(prog="orchestrator")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    saved = structlog.get_config()
    try:
        return args.func(args)
    finally:
        structlog.configure(**saved)


def test_deploy_then_status_logs_stop(sglang_sim: SGLangSim, tmp_path: Path, capsys,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sim = sglang_sim
    sim.state_dir("../run")  # the playbook's BASE_DIR/run: stopped after the test
    inv = str(sim.fleet.inventory_path)
    pb = playbook(sim, tmp_path / "serve.yaml")
    env = {"SGLANG_API_KEY": API_KEY}

    first = cli("deploy", str(pb), "-i", inv, "--limit", "gpu", runs=tmp_path / "runs", env=env)
    assert first.code == 0, first.stdout + first.stderr
    assert first.statuses("gpu-1") == {"server": "changed", "ready": "changed"}
    facts = first.summary["hosts"]["gpu-1"]["facts"]["ready"]
    assert 2.3 < facts["accept_length"] < 2.8 and facts["model"] == "kimi-k2.6"
    record = "\n".join([first.stdout, first.stderr, json.dumps(first.summary),
                        (first.run_dir / "events.jsonl").read_text()])
    assert API_KEY not in record
    assert cmdlines_with(API_KEY) == []

    second = cli("deploy", str(pb), "-i", inv, "--limit", "gpu", runs=tmp_path / "runs",
                 env=env)
    assert second.code == 0, second.stdout + second.stderr
    assert second.statuses("gpu-1") == {"server": "ok", "ready": "ok"}
    stages = second.summary["hosts"]["gpu-1"]["stages"]
    assert stages["server"]["check_s"] < 1.0 and stages["ready"]["check_s"] < 1.0, stages

    # status (JSON): running, ready, model, speculation and its accept length
    monkeypatch.setenv("SGLANG_API_KEY", API_KEY)
    capsys.readouterr()
    assert run("status", "-i", inv, "--json") == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["host"] == "gpu-1" and row["state"] == "running" and row["ready"] is True
    assert row["model"] == "kimi-k2.6" and row["speculative_algorithm"] == "EAGLE3"
    assert 2.3 < row["accept_length"] < 2.8 and row["version"] == "0.5.23"
    pid = row["pid"]
    assert pid in sim.server_pids() and row["uptime_s"] >= 0
    # the load's phases, read from the server's log
    phases = [p["phase"] for p in row["load_timeline"]]
    assert "target weights" in phases and phases[-1] == "first ready", phases
    assert row["load_timeline"][0]["start"] <= time.time() - row["uptime_s"] + 1

    assert run("status", "-i", inv) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:4] == ["HOST", "STATE", "PID", "UPTIME"]
    assert f"gpu-1  running  {pid}" in table and "EAGLE3" in table and "yes" in table
    assert "  load: process start" in table and "cuda graph capture" in table

    # logs: the last N lines, prefixed by host
    assert run("logs", "-i", inv, "-n", "5") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all(ln.startswith("gpu-1 | ") for ln in lines)
    assert API_KEY not in "\n".join(lines)

    # logs -f: new lines appear as the server writes them
    seen: list[str] = []
    stop = threading.Event()
    targets = resolve_targets(inv, limit=["gpu-1"])
    follower = threading.Thread(target=follow_logs, args=(targets, seen.append),
                                kwargs={"lines": 1, "interval": 0.1, "stop": stop})
    follower.start()
    try:
        assert wait_for(lambda: len(seen) >= 1, timeout=10)
        req = urllib.request.Request(f"http://{sim.address}:{sim.port}/v1/models",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
        urllib.request.urlopen(req, timeout=5).read()
        assert wait_for(lambda: any("GET /v1/models" in s for s in seen), timeout=10), seen
    finally:
        stop.set()
        follower.join(10)
    assert all(s.startswith("gpu-1 | ") for s in seen)

    # stop: graceful, exit 0; then status says stopped (exit 1: not ready); stop again is fine
    assert run("stop", "-i", inv, "--timeout", "10s") == 0
    out = capsys.readouterr().out
    assert f"gpu-1: stopped pid {pid} in " in out and "SIGKILL" not in out
    assert sim.server_pids() == [] and not sim.port_open()
    assert run("status", "-i", inv, "--json") == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["detail"], row["ready"]) == ("stopped", "stopped on request", False)
    assert run("stop", "-i", inv) == 0
    assert "gpu-1: not running" in capsys.readouterr().out


def test_status_reports_a_dead_server_and_the_host_rule(sglang_sim: SGLangSim,
                                                        capsys) -> None:
    sim = sglang_sim
    inv = str(sim.fleet.inventory_path)
    sd = sim.state_dir("dead")
    cls = stage_kinds()["sglang_server"]
    # restart off: restarted, it would not stay dead
    stage = cls(cls.Params.model_validate(sim.server_params(sd, restart_on_failure=False)))
    ctx = StageContext(spec=StageSpec(id="server", uses="sglang_server"), run_id="t",
                       log=structlog.get_logger())
    host = sim.connect()
    stage.apply(host, ctx, stage.check(host, ctx).plan)  # as the runner does
    pid = ctx.facts["pid"]
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: pid not in sim.server_pids(), timeout=10)
    assert wait_for(lambda: Path(sd, "server.exit").exists(), timeout=10)
    capsys.readouterr()  # the stage's own log lines
    assert run("status", "-i", inv, "--state-dir", sd, "--limit", "gpu-1", "--json") == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["state"], row["detail"]) == ("dead", "killed by signal 9 (SIGKILL)")

    # the host rule: hypervisors have no base_dir; naming one is an error that says what to do
    with pytest.raises(ConfigError, match="no state dir for pve-1"):
        run("status", "-i", inv, "--limit", "pve-1")
    assert [t.name for t in resolve_targets(inv)] == ["gpu-1"]
    t = resolve_targets(inv, cli_vars={"sglang_port": 30001})[0]
    assert (t.url, t.state_dir) == (f"http://{sim.address}:30001", str(sim.base / "run"))
