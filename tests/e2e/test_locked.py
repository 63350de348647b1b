"""Repeatable deploys end to end: staging (gpu-1) writes a pin file, prod (gpu-2) deploys
`--locked` to it, and a drafter revision that moved is refused before anything changes.

One simulated fleet with two boxes; each has its own base_dir and loopback address, as staging
and production would. The tests of this module run in order and reuse the deployed hosts.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.hubrepos import EAGLE3_OLD_BRANCH, EAGLE3_REPO, KIMI_REPO, list_refs
from tests.runner.helpers import CliRun, cli, write_yaml
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")
SCALE = 0.001
CANARY = "sk-lock-canary-6b1f0c"  # the API key: must never reach a pin file
STAGING, PROD = "gpu-1", "gpu-2"


class Fleet:
    """Two simulated boxes and a way to run the CLI on one of them with host-var overrides."""

    def __init__(self, fleet: SimFleet, work: Path) -> None:
        self.fleet = fleet
        self.work = work
        self.data = yaml.safe_load(Path(fleet.inventory_path).read_text())
        self.n = 0
        self.locks: dict[str, Path] = {}

    def hostvars(self, host: str) -> dict[str, Any]:
        return self.data["hosts"][host]["vars"]

    def run(self, command: str, host: str, *args: str,
            overrides: dict[str, Any] | None = None) -> CliRun:
        self.n += 1
        inv = str(self.fleet.inventory_path)
        if overrides:
            data = copy.deepcopy(self.data)
            data["hosts"][host]["vars"].update(overrides)
            inv = str(write_yaml(self.work / f"inv-{self.n}.yaml", data))
        return cli(command, PLAYBOOK, "-i", inv, "--limit", host, *args,
                   runs=self.work / f"runs-{self.n}", env={"SGLANG_API_KEY": CANARY},
                   timeout=240)

    def server_pid(self, host: str) -> int | None:
        pidfile = Path(self.hostvars(host)["base_dir"]) / "run" / "server.pid"
        try:
            pid = int(json.loads(pidfile.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def drafter_dir(self, host: str) -> Path:
        return Path(self.hostvars(host)["base_dir"]) / "models" / EAGLE3_REPO.replace("/", "--")


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("locked")
    fleet = SimFleet.up(work / "sim", hosts=2, time_scale=SCALE)
    try:
        yield Fleet(fleet, work)
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


def _lock(r: CliRun) -> dict[str, Any]:
    assert r.run_dir is not None, r.stderr
    path = r.run_dir / "deploy.lock.json"
    assert path.is_file(), r.stdout + r.stderr
    return json.loads(path.read_text())


def _refs(boxes: Fleet, repo: str) -> dict[str, str]:
    return list_refs(boxes.fleet.simdir / "hub", repo)


def test_staging_deploy_writes_the_lock_of_what_it_ran(boxes: Fleet) -> None:
    r = boxes.run("deploy", STAGING)
    assert r.code == 0, r.stdout + r.stderr
    assert "pin file:" in r.stdout
    lock = _lock(r)
    boxes.locks[STAGING] = r.run_dir / "deploy.lock.json"  # type: ignore[operator]
    st = lock["stages"]
    assert lock["disagreements"] == []
    assert st["target"] == {"repo": KIMI_REPO, "commit": _refs(boxes, KIMI_REPO)["main"],
                            "files": st["target"]["files"], "bytes": st["target"]["bytes"]}
    assert st["target"]["files"] > 3 and st["target"]["bytes"] > 0
    assert st["drafter"]["commit"] == _refs(boxes, EAGLE3_REPO)["main"]
    assert st["packages"]["versions"]["sglang"] == "0.5.23"
    assert st["packages"]["versions"]["huggingface_hub"] == "2.4.0"
    assert st["packages"]["versions"]["compressed-tensors"] == "0.18.0"
    assert st["venv"]["python"].count(".") == 2
    server = st["server"]
    assert server["sglang_version"] == "0.5.23"
    args = server["args"]
    assert args[args.index("--model-path") + 1] == "<model_path>"
    assert args[args.index("--speculative-draft-model-path") + 1] == "<draft_model_path>"
    assert args[args.index("--host") + 1] == "<host>" and server["bind"] == "loopback"
    assert args[args.index("--tp-size") + 1] == "8"
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert "NCCL_P2P_LEVEL" in server["env"]["names"] and len(server["env"]["sha256"]) == 64
    text = json.dumps(st)
    assert boxes.hostvars(STAGING)["base_dir"] not in text  # no host-specific paths
    assert boxes.hostvars(STAGING)["sglang_host"] not in text
    assert CANARY not in (r.run_dir / "deploy.lock.json").read_text()  # type: ignore[operator]


def test_prod_deploys_exactly_the_staging_lock(boxes: Fleet) -> None:
    staging = json.loads(boxes.locks[STAGING].read_text())
    r = boxes.run("deploy", PROD, "--locked", str(boxes.locks[STAGING]))
    assert r.code == 0, r.stdout + r.stderr
    st = r.statuses(PROD)
    for stage in ("venv", "packages", "target", "drafter", "server", "ready"):
        assert st[stage] == "changed", (stage, st)
    prod = _lock(r)
    boxes.locks[PROD] = r.run_dir / "deploy.lock.json"  # type: ignore[operator]
    assert prod["stages"] == staging["stages"]
    assert boxes.server_pid(PROD) is not None
    # and a converged prod shows no drift against that lock
    r = boxes.run("plan", PROD, "--locked", str(boxes.locks[STAGING]))
    assert r.code == 0, r.stdout + r.stderr
    assert set(r.statuses(PROD).values()) == {"ok"}, r.stdout
    assert "no drift against" in r.stdout


def _moved_drafter() -> dict[str, Any]:
    return {"repo": EAGLE3_REPO, "revision": EAGLE3_OLD_BRANCH,
            "architecture": "LlamaForCausalLMEagle3"}


def test_plan_locked_lists_every_drift(boxes: Fleet) -> None:
    pid = boxes.server_pid(PROD)
    launch = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())["launch"]
    launch["mem_fraction_static"] = 0.85
    r = boxes.run("plan", PROD, "--locked", str(boxes.locks[STAGING]), overrides={
        "drafter": _moved_drafter(), "launch": launch,
        "packages": ["sglang==0.5.23", "compressed-tensors>=0.10.0,<0.18",
                     "huggingface_hub==2.4.0"],
    })
    assert r.code == 0, r.stdout + r.stderr
    stages = r.summary["hosts"][PROD]["stages"]
    old, new = _refs(boxes, EAGLE3_REPO)[EAGLE3_OLD_BRANCH], _refs(boxes, EAGLE3_REPO)["main"]
    assert stages["drafter"]["status"] == "would-change"
    reason = stages["drafter"]["reason"]
    assert reason.startswith("drift:") and old[:12] in reason and new[:12] in reason
    assert "refuses" in reason
    assert stages["packages"]["status"] == "would-change"
    assert "drift:" in stages["packages"]["reason"]
    assert "compressed-tensors 0.18.0" in stages["packages"]["reason"]
    assert stages["server"]["status"] == "would-change"
    assert "drift:" in stages["server"]["reason"]
    assert "--mem-fraction-static 0.88 -> 0.85" in stages["server"]["reason"]
    assert stages["target"]["status"] == "ok"
    assert "drift against" in r.stdout and "(3):" in r.stdout
    assert f"{PROD} drafter: revision 'v1'" in r.stdout
    assert boxes.server_pid(PROD) == pid
    assert not (r.run_dir / "deploy.lock.json").exists()  # type: ignore[operator]


def test_locked_deploy_refuses_a_moved_drafter_before_changing_anything(boxes: Fleet) -> None:
    pid = boxes.server_pid(PROD)
    drafter = boxes.drafter_dir(PROD)
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size)
              for p in drafter.rglob("*") if p.is_file()}
    manifest = (drafter / ".orchestrator" / "manifest.json").read_text()
    r = boxes.run("deploy", PROD, "--locked", str(boxes.locks[STAGING]),
                  overrides={"drafter": _moved_drafter()})
    assert r.code == 1, r.stdout + r.stderr
    st = r.statuses(PROD)
    assert st["drafter"] == "failed"
    assert st["inspect"] == "skipped" and st["server"] == "skipped" and st["ready"] == "skipped"
    error = r.summary["hosts"][PROD]["stages"]["drafter"]["error"]
    old, new = _refs(boxes, EAGLE3_REPO)[EAGLE3_OLD_BRANCH], _refs(boxes, EAGLE3_REPO)["main"]
    assert "drafter" in error and "refused by --locked" in error
    assert old[:12] in error and new[:12] in error
    assert "deploy without --locked" in error and "promote the new pin" in error
    # nothing changed: the drafter's files and manifest, the running server
    assert (drafter / ".orchestrator" / "manifest.json").read_text() == manifest
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size)
            for p in drafter.rglob("*") if p.is_file()} == before
    assert boxes.server_pid(PROD) == pid
    # a failed stage's facts never make it into a lock
    lock_path = r.run_dir / "deploy.lock.json"  # type: ignore[operator]
    if lock_path.exists():
        assert "drafter" not in json.loads(lock_path.read_text())["stages"]


def test_a_lock_file_that_is_not_json_is_a_usage_error(boxes: Fleet) -> None:
    bad = boxes.work / "bad.lock.json"
    bad.write_text("this is not { json")
    r = boxes.run("deploy", PROD, "--locked", str(bad))
    assert r.code == 2
    assert "not a readable JSON pin file" in r.stdout + r.stderr
    r = boxes.run("plan", PROD, "--locked", str(boxes.work / "missing.json"))
    assert r.code == 2
    assert "pin file not found" in r.stdout + r.stderr
