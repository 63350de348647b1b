"""The mission end to end: `orchestrator deploy playbooks/kimi-k2.6-eagle3.yaml` against a
simulated 8-GPU LXC host (with its Proxmox hypervisor, model hub and package index), over SSH
with host keys checked. The tests of this module run in order on one simulated box.

The second deploy, on the converged box, is a library call: `orchestrator.deploy.deploy()` in
this process, typed events reaching a handler passed in (what the CLI's deploy runs)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.bench.gantt import read_timeline
from orchestrator.deploy import deploy
from orchestrator.events import CommandRan, EventHandler, StageApply, StageFinished
from orchestrator_sim.fleet import SimFleet
from tests.runner.helpers import CliRun, cli, write_yaml
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")
SCALE = 0.001  # the nominal 960 s load takes ~1 s

#: what a first deploy does on the box as found (a venv without pip, compressed-tensors 0.8.1)
FIRST = {"health": "ok", "venv": "changed", "packages": "changed", "target": "changed",
         "drafter": "changed", "inspect": "ok", "server": "changed", "ready": "changed"}


class Collector(EventHandler):
    """The typed events a library deploy hands to its handler."""

    def __init__(self) -> None:
        self.finished: list[StageFinished] = []
        self.applied: list[StageApply] = []
        self.commands: list[CommandRan] = []

    def on_command(self, e: CommandRan) -> None:
        self.commands.append(e)

    def on_stage_finished(self, e: StageFinished) -> None:
        self.finished.append(e)

    def on_stage_apply(self, e: StageApply) -> None:
        self.applied.append(e)


class Box:
    """The simulated box, its inventory, and a way to deploy with host-var overrides."""

    def __init__(self, fleet: SimFleet, work: Path) -> None:
        self.fleet = fleet
        self.work = work
        self.inventory = fleet.inventory_path
        self.data = yaml.safe_load(Path(self.inventory).read_text())
        self.n = 0
        self.first: CliRun | None = None  # the first deploy, on the box as found

    @property
    def hostvars(self) -> dict[str, Any]:
        return self.data["hosts"]["gpu-1"]["vars"]

    def deploy(self, *args: str, overrides: dict[str, Any] | None = None,
               inventory: str | None = None) -> CliRun:
        self.n += 1
        inv = inventory or str(self.inventory)
        if overrides:
            data = copy.deepcopy(self.data)
            data["hosts"]["gpu-1"]["vars"].update(overrides)
            inv = str(write_yaml(self.work / f"inv-{self.n}.yaml", data))
        return cli("deploy", PLAYBOOK, "-i", inv, *args, runs=self.work / f"runs-{self.n}",
                   timeout=240)

    def server_pid(self) -> int | None:
        pidfile = Path(self.hostvars["base_dir"]) / "run" / "server.pid"
        try:
            pid = int(json.loads(pidfile.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    work = tmp_path_factory.mktemp("k26")
    fleet = SimFleet.up(work / "sim", hosts=1, time_scale=SCALE)
    try:
        as_found = subprocess.run(
            [sys.executable, str(REPO / "scripts/sim_as_found.py"), str(fleet.simdir), "gpu-1"],
            capture_output=True, text=True, timeout=180)
        assert as_found.returncode == 0, as_found.stderr
        yield Box(fleet, work)
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


def test_fresh_box_one_deploy_reaches_ready(box: Box) -> None:
    r = box.first = box.deploy()
    assert r.code == 0, r.stdout + r.stderr
    assert r.statuses("gpu-1") == FIRST
    assert [e for e in r.events if e["event"] == "command"]  # it ran plenty
    facts = r.summary["hosts"]["gpu-1"]["facts"]
    assert facts["health"]["uvm"]["cuda_init"]["code"] == 0  # idle GPUs: cuInit ran in a process
    # the old compressed-tensors was upgraded before the launch
    installed = str(facts["packages"])
    assert "0.18.0" in installed and "0.8.1" not in installed
    assert facts["ready"]["accept_length"] > 1.2
    assert "ready after" in r.stdout and "accept length" in r.stdout
    # the KV pool predicted before the launch (rules/memory.py), shown and kept
    pool = facts["server"]["kv_pool"]
    assert pool["context_length"] == 262144 and pool["tokens"] > 262144 * 0.95
    assert f"predicted KV pool {pool['tokens']:,} tokens per rank" in r.stdout + r.stderr
    # the load timeline, from the server's own log: a first load compiles its kernels (cold)
    phases = {p["phase"]: p for p in facts["ready"]["load_timeline"]}
    assert set(phases) == {"process start", "target weights", "kv pool", "draft weights",
                           "cuda graph capture", "first ready"}  # the order varies by release
    assert float(phases["cuda graph capture"]["detail"].split()[0]) > 200  # nominal s, cold
    assert "load: process start" in r.stdout + r.stderr
    # ... and in the deploy report's Gantt chart, under the ready bar, from the server stage on
    ready = next(b for b in read_timeline(r.run_dir / "events.jsonl").bars if b.stage == "ready")
    assert {p for p, _, _ in ready.phases} == set(phases)
    server = next(b for b in read_timeline(r.run_dir / "events.jsonl").bars
                  if b.stage == "server")
    assert server.start < ready.phases[0][1] < ready.start  # the process started in `server`
    assert box.server_pid() is not None
    # host keys were checked: the inventory says strict, with the simulator's known_hosts
    assert box.data["hosts"]["gpu-1"]["host_key_policy"] == "strict"


def test_second_deploy_as_a_library_call_changes_nothing_and_runs_no_command(box: Box) -> None:
    assert box.first is not None and box.first.code == 0, "needs the first deploy"
    pid = box.server_pid()
    seen = Collector()
    two = deploy(PLAYBOOK, box.inventory, run_dir=box.work / "runs-library", handlers=[seen])
    assert two.exit_code == 0, two.summary
    assert set(two.statuses("gpu-1").values()) == {"ok"}
    assert {e.stage: e.status for e in seen.finished} == {stage: "ok" for stage in FIRST}
    assert seen.applied == []
    # a converged host answers from the agent alone: no command, so no interpreter, no pip,
    # no huggingface_hub, no CUDA init process (the first deploy ran plenty)
    assert seen.commands == [], [c.command[:80] for c in seen.commands]
    uvm = two.summary.hosts["gpu-1"].facts["health"]["uvm"]
    assert uvm["cuda_init"] is None and uvm["open"]["ok"]  # proven by the agent's open()
    assert two.summary_path.exists() and two.events_path.exists()
    assert two.pin_path is not None
    assert two.run_dir != box.first.run_dir
    assert box.server_pid() == pid


@pytest.mark.parametrize(("repo", "fragments"), [
    ("sim/eagle3-hidden4096", ["hidden_size", "4096", "7168"]),
    ("sim/eagle3-vocab-mismatch", ["vocab_size", "129280", "163840"]),
])
def test_drafter_that_does_not_fit_is_refused_before_launch(
    box: Box, repo: str, fragments: list[str]
) -> None:
    pid = box.server_pid()
    drafter = {"repo": repo, "revision": "main", "architecture": "LlamaForCausalLMEagle3"}
    r = box.deploy(overrides={"drafter": drafter})
    assert r.code == 1
    st = r.statuses("gpu-1")
    assert st["inspect"] == "failed" and st["server"] == "skipped" and st["ready"] == "skipped"
    error = r.summary["hosts"]["gpu-1"]["stages"]["inspect"]["error"]
    for fragment in fragments:
        assert fragment in error
    assert box.server_pid() == pid  # the running server was not touched


def test_drafter_without_its_vocabulary_map_is_refused_by_preflight(box: Box) -> None:
    """Its config is right (inspect passes); its weights lack d2t: the preflight reads the
    tensor names from the downloaded checkpoint's header and refuses before any launch."""
    pid = box.server_pid()
    drafter = {"repo": "sim/eagle3-no-vocab-map", "revision": "main",
               "architecture": "LlamaForCausalLMEagle3"}
    r = box.deploy(overrides={"drafter": drafter})
    assert r.code == 1
    st = r.statuses("gpu-1")
    assert st["inspect"] in ("ok", "changed") and st["server"] == "failed"
    error = r.summary["hosts"]["gpu-1"]["stages"]["server"]["error"]
    assert "no d2t tensor" in error and "32000" in error
    assert box.server_pid() == pid


def test_eagle_with_an_eagle3_drafter_is_refused_by_preflight(box: Box) -> None:
    pid = box.server_pid()
    spec = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    r = box.deploy(overrides={"speculative": spec})
    assert r.code == 1
    st = r.statuses("gpu-1")
    assert st["server"] == "failed" and st["ready"] == "skipped"
    error = r.summary["hosts"]["gpu-1"]["stages"]["server"]["error"]
    assert "EAGLE3" in error and "1.00" in error
    assert box.server_pid() == pid


def test_removed_flag_is_refused_by_preflight_not_after_the_load(box: Box) -> None:
    pid = box.server_pid()
    launch = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())["launch"]
    launch["extra_args"] = ["--cuda-graph-max-bs", "16"]
    r = box.deploy(overrides={"launch": launch})
    assert r.code == 1
    error = r.summary["hosts"]["gpu-1"]["stages"]["server"]["error"]
    assert "--cuda-graph-max-bs" in error and "0.5.23" in error
    assert box.server_pid() == pid


def test_uvm_cgroup_fault_is_fixed_through_the_hypervisor(box: Box) -> None:
    box.fleet.fault("gpu-1", "uvm-cgroup")
    r = box.deploy()
    assert r.code == 0, r.stdout + r.stderr
    st = r.statuses("gpu-1")
    assert st["health"] == "changed"
    # restarting the container killed the server: it comes back; nothing else was redone
    assert st["server"] == "changed" and st["ready"] == "changed"
    for stage in ("venv", "packages", "target", "drafter", "inspect"):
        assert st[stage] == "ok", (stage, st)
    fix = r.summary["hosts"]["gpu-1"]["facts"]["health"]["uvm_fix"]
    assert fix["backup"]


def test_uvm_fault_without_hypervisor_is_explained_with_the_exact_line(box: Box) -> None:
    box.fleet.fault("gpu-1", "uvm-cgroup")
    data = copy.deepcopy(box.data)
    del data["hosts"]["gpu-1"]["hypervisor"]
    inv = write_yaml(box.work / "inv-nohv.yaml", data)
    r = box.deploy("--only", "health", inventory=str(inv))
    assert r.code == 1
    error = r.summary["hosts"]["gpu-1"]["stages"]["health"]["error"]
    assert "lxc.cgroup2.devices.allow: c " in error and ":* rwm" in error
    assert "pct stop" in error and "nvidia-modprobe" in error


def test_server_dying_while_loading_is_reported_at_once_with_its_log_tail(box: Box) -> None:
    # uvm is still broken from the previous test; stop the server, then launch without the
    # health stage: the new server dies in CUDA init while "loading"
    stop = cli("stop", "-i", str(box.inventory), "--limit", "gpu", runs=box.work / "stop")
    assert stop.code == 0, stop.stderr
    t0 = time.monotonic()
    r = box.deploy("--skip", "health")
    took = time.monotonic() - t0
    assert r.code == 1
    st = r.statuses("gpu-1")
    failed = "ready" if st["ready"] == "failed" else "server"
    assert st[failed] == "failed"
    error = r.summary["hosts"]["gpu-1"]["stages"][failed]["error"]
    assert "CUDA" in error and "999" in error  # the server's own last log lines
    assert took < 120  # nowhere near wait_ready's 30-minute timeout
    # and the same command repairs everything
    r = box.deploy()
    assert r.code == 0, r.stdout + r.stderr
    assert box.server_pid() is not None

