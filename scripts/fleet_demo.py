"""`make fleet-demo`: 3 Kimi K2.6 + EAGLE-3 replicas behind the SMG gateway on simulated hosts,
under a steady streaming load through the gateway:

  1. first deploy (drafter at its older revision), keys on (client key + control-plane key);
  2. roll a change: the drafter's new revision - downloaded on every replica while all serve,
     then one replica at a time out of the gateway for its restart only;
  3. SIGKILL one replica's server: the gateway's health checks and retries keep clients served;
     a plain deploy brings it back and re-adds it;
  4. SIGKILL the orchestrator in the middle of a roll, then a plain deploy: membership complete.

It ends with one line (wrapped here):
  fleet-demo: roll N requests F failed; kill window W.Ws K failed; members M/M;
  out-of-rotation R.Rx restart
(R: the mean time a replica was out of the gateway over its server's stop-to-ready time).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.deploy import deploy  # noqa: E402
from orchestrator.events import EventHandler, ReplicaRoll, StageFinished  # noqa: E402
from orchestrator_sim.fleet import SimFleet  # noqa: E402
from orchestrator_sim.hubrepos import EAGLE3_OLD_BRANCH  # noqa: E402
from scripts.fetch_gateway_wheels import CACHE  # noqa: E402
from scripts.fetch_gateway_wheels import main as fetch_wheels  # noqa: E402

PLAYBOOK = REPO / "playbooks/kimi-k2.6-fleet.yaml"
REPLICAS = ["gpu-1", "gpu-2", "gpu-3"]
GATEWAY = "gpu-4"
PORT = 30080
SCALE = float(os.environ.get("FLEET_DEMO_SCALE", "0.01"))
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Load:
    """Streaming chat completions through the gateway, `clients` at a time, until stopped; every
    request's start, end and error (None: it completed) is kept."""

    def __init__(self, url: str, key: str, clients: int = 3) -> None:
        self.url, self.key = url, key
        self.done: list[tuple[float, float, str | None]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _one(self) -> str | None:
        body = json.dumps({"model": "kimi-k2.6", "max_tokens": 32, "stream": True,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        try:
            with _OPENER.open(req, timeout=60) as resp:
                text = resp.read().decode(errors="replace")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return repr(exc)[:200]
        return None if "data: [DONE]" in text else "stream ended without [DONE]"

    def _client(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            error = self._one()
            with self.lock:
                self.done.append((t0, time.monotonic(), error))

    def between(self, t0: float, t1: float) -> list[tuple[float, float, str | None]]:
        """Requests that started in [t0, t1)."""
        with self.lock:
            return [r for r in self.done if t0 <= r[0] < t1]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


class Steps(EventHandler):
    """Roll steps and stage results, stamped with the time they arrived."""

    def __init__(self) -> None:
        self.roll: list[tuple[float, ReplicaRoll]] = []
        self.stages: list[tuple[float, StageFinished]] = []

    def on_replica_roll(self, e: ReplicaRoll) -> None:
        self.roll.append((time.monotonic(), e))
        took = f" ({e.duration_s:.1f}s)" if e.duration_s is not None else ""
        print(f"  {e.host}: {e.step}{took} {e.detail or ''}", flush=True)

    def on_stage_finished(self, e: StageFinished) -> None:
        self.stages.append((time.monotonic(), e))

    def out_over_restart(self) -> list[float]:
        """Per replica rolled: time out of the gateway (removed -> serving) over its server's
        stop-to-ready time (drained -> its `ready` stage finished)."""
        ratios = []
        for host in REPLICAS:
            mine = {e.step: (t, e) for t, e in self.roll if e.host == host}
            ready = [t for t, e in self.stages if e.host == host and e.stage == "ready"]
            if not {"removed", "drained", "serving"} <= set(mine) or not ready:
                continue
            t_rm, rm = mine["removed"]
            out = mine["serving"][0] - (t_rm - (rm.duration_s or 0.0))
            restart = ready[-1] - mine["drained"][0]
            if restart > 0:
                ratios.append(out / restart)
        return ratios


def _inventory(fleet: SimFleet, path: Path) -> tuple[Path, str]:
    inv = yaml.safe_load(fleet.inventory_path.read_text())
    inv["groups"]["replicas"] = {"hosts": REPLICAS}
    inv["groups"]["gateway"] = {"hosts": [GATEWAY]}
    address = inv["hosts"][GATEWAY]["address"]
    inv["hosts"][GATEWAY]["vars"]["gateway_host"] = address
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path, f"http://{address}:{PORT}"


def _members(url: str, admin_key: str) -> dict[str, str]:
    req = urllib.request.Request(url + "/workers",
                                 headers={"Authorization": f"Bearer {admin_key}"})
    with _OPENER.open(req, timeout=10) as resp:
        return {w["url"]: w.get("status", "") for w in json.loads(resp.read())["workers"]}


def _server_pid(fleet: SimFleet, host: str) -> int:
    pidfile = fleet.simdir / "hosts" / host / "root/opt/orchestrator/run/server.pid"
    return int(json.loads(pidfile.read_text())["pid"])


def _drafter(revision: str) -> dict[str, Any]:
    profile = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())
    return {"drafter": {**profile["drafter"], "revision": revision}}


def _deploy(inventory: Path, runs: Path, steps: Steps | None = None,
            **cli_vars: Any) -> int:
    out = deploy(PLAYBOOK, inventory, run_dir=runs, handlers=[steps] if steps else [],
                 cli_vars=cli_vars or None)
    return out.exit_code


def _killed_mid_roll(inventory: Path, runs: Path, url: str, admin_key: str) -> dict[str, Any]:
    """A deploy of a changed launch, SIGKILLed once a replica left the gateway; its variables
    (for the re-run)."""
    profile = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())
    launch = {**profile["launch"], "mem_fraction_static": 0.86}
    changed = runs.parent / "changed-launch.yaml"
    variables = {"launch": launch, **_drafter("main")}
    changed.write_text(yaml.safe_dump(variables))
    cmd = [str(REPO / ".venv/bin/orchestrator"), "deploy", str(PLAYBOOK), "-i", str(inventory),
           "--run-dir", str(runs), "--vars-file", str(changed)]
    log = (runs.parent / "killed-deploy.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            listed = _members(url, admin_key)  # a removed worker is Draining, then gone
            if len(listed) < len(REPLICAS) or any(st != "ready" for st in listed.values()):
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    if proc.returncode != -signal.SIGKILL:
        raise SystemExit(f"the deploy to kill ended by itself (exit {proc.returncode}); see "
                         f"{runs.parent / 'killed-deploy.log'}")
    listed = _members(url, admin_key)
    ready = sum(1 for st in listed.values() if st == "ready")
    print(f"  orchestrator SIGKILLed mid-roll: the gateway lists {len(listed)} workers, "
          f"{ready} of {len(REPLICAS)} replicas Ready", flush=True)
    return variables


def main() -> int:
    if fetch_wheels() != 0:
        print(f"fleet-demo needs the smg wheels in {CACHE}", file=sys.stderr)
        return 1
    work = REPO / ".sim" / "fleet-demo"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    api_key, admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    os.environ["SGLANG_API_KEY"] = api_key
    os.environ["ORCHESTRATOR_GATEWAY_ADMIN_KEY"] = admin_key
    fleet = SimFleet.up(work / "sim", hosts=4, time_scale=SCALE)
    try:
        for whl in CACHE.glob("*.whl"):
            shutil.copy2(whl, fleet.simdir / "wheels" / whl.name)
        inventory, url = _inventory(fleet, work / "inventory.yaml")
        runs = work / "runs"
        print("== first deploy: 3 replicas + the SMG gateway, keys on", flush=True)
        if _deploy(inventory, runs, **_drafter(EAGLE3_OLD_BRANCH)) != 0:
            return 1
        with Load(url, api_key) as load:
            time.sleep(1.0)
            print("== roll: the drafter's new revision", flush=True)
            steps = Steps()
            t0 = time.monotonic()
            rc = _deploy(inventory, runs, steps, **_drafter("main"))
            roll = load.between(t0, time.monotonic())
            if rc != 0:
                return 1
            print("== SIGKILL gpu-2's server, then deploy", flush=True)
            tk = time.monotonic()
            os.kill(_server_pid(fleet, "gpu-2"), signal.SIGKILL)
            time.sleep(5.0)
            print(f"  5 s after the kill the gateway lists: {_members(url, admin_key)}")
            rc = _deploy(inventory, runs, Steps(), **_drafter("main"))
            kill = load.between(tk, time.monotonic())
            print(f"  deploy exit {rc}; members {_members(url, admin_key)}", flush=True)
            if rc != 0:
                return 1
            print("== SIGKILL the orchestrator mid-roll, then deploy", flush=True)
            again = _killed_mid_roll(inventory, runs, url, admin_key)
            rc = _deploy(inventory, runs, Steps(), **again)  # the same deploy, run again
            members = _members(url, admin_key)
            print(f"  deploy exit {rc}; members {members}", flush=True)
        failed = [r for r in kill if r[2]]
        window = (max(r[1] for r in failed) - min(r[0] for r in failed)) if failed else 0.0
        ready = sum(1 for s in members.values() if s == "ready")
        ratios = steps.out_over_restart()
        mean = sum(ratios) / len(ratios) if ratios else float("nan")
        print(f"fleet-demo: roll {len(roll)} requests {sum(1 for r in roll if r[2])} failed; "
              f"kill window {window:.1f}s {len(failed)} failed; members {ready}/{len(REPLICAS)}; "
              f"out-of-rotation {mean:.1f}x restart")
        return 0 if rc == 0 else 1
    finally:
        fleet.down()


if __name__ == "__main__":
    sys.exit(main())
