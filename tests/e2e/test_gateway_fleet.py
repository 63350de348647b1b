"""Replicas behind the REAL gateway (SMG, PyPI smg 1.13.0, its Rust binary) on simulated hosts:
a keyed 3-replica fleet deploys and serves through the gateway; worker management without the
control-plane key is refused (401); a non-loopback bind without keys is refused at load; a
launch smg refuses only at start fails the stage while the old gateway keeps serving; a worker
DELETEd out of band keeps the stage from `ok` (a dry run says would-change) until a plain deploy
adds it back; and a plain deploy of a changed launch rolls the replicas under load, losing no
request.

The gateway's wheel and its dependencies come from .cache/gateway-wheels/ (`make
gateway-wheels`, once, from PyPI); they are copied into the simulator's package index, so the
gateway host installs them with real pip and no network. Without them this module skips.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.deploy import deploy
from orchestrator.errors import ConfigError
from orchestrator.events import EventHandler, ReplicaRoll
from orchestrator.options import RunOptions
from orchestrator.plan import Selection
from orchestrator.service import collect_status, resolve_targets, status_exit_code
from orchestrator_sim.fleet import SimFleet
from scripts.fetch_gateway_wheels import CACHE, HINT, have_wheels
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks/kimi-k2.6-fleet.yaml"
PROFILE = REPO / "configs/models/kimi-k2.6.yaml"
SCALE = 0.001
REPLICAS = ["gpu-1", "gpu-2", "gpu-3"]
GATEWAY = "gpu-4"
PORT = 30080
API_KEY, ADMIN_KEY = "fleet-data-key-5150", "fleet-admin-key-8086"
KEYS = {"api_key": API_KEY, "gateway_admin_key": ADMIN_KEY}

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_wheels(), reason=HINT)]
_OPEN = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Roll(EventHandler):
    """The roll steps."""

    def __init__(self) -> None:
        self.steps: list[ReplicaRoll] = []

    def on_replica_roll(self, e: ReplicaRoll) -> None:
        self.steps.append(e)


def _call(url: str, key: str | None = None, method: str = "GET",
          body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body else None)
    try:
        with _OPEN.open(req, timeout=60) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _chat(base: str, key: str | None) -> int:
    return _call(base + "/v1/chat/completions", key, "POST",
                 {"model": "kimi-k2.6", "max_tokens": 8, "temperature": 0,
                  "messages": [{"role": "user", "content": "hello"}]})[0]


class Load:
    """Clients sending chat completions through the gateway until stopped."""

    def __init__(self, base: str, clients: int = 4) -> None:
        self.base, self.sent, self.failed = base, 0, []
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True)
                        for _ in range(clients)]

    def _client(self) -> None:
        while not self.stop.is_set():
            try:
                status: Any = _chat(self.base, API_KEY)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                status = repr(exc)
            with self.lock:
                self.sent += 1
                if status != 200:
                    self.failed.append(status)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def _inventory(fleet: SimFleet, path: Path) -> tuple[Path, str, dict[str, str]]:
    """The simulator's inventory plus the groups `replicas` and `gateway`."""
    inv = yaml.safe_load(fleet.inventory_path.read_text())
    inv["groups"]["replicas"] = {"hosts": REPLICAS}
    inv["groups"]["gateway"] = {"hosts": [GATEWAY]}
    address = inv["hosts"][GATEWAY]["address"]  # 127.0.1.x: loopback, a port of its own
    inv["hosts"][GATEWAY]["vars"]["gateway_host"] = address
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    urls = {h: f"http://{inv['hosts'][h]['address']}:30000" for h in REPLICAS}
    return path, f"http://{address}:{PORT}", urls


def _seed_index(fleet: SimFleet) -> None:
    """The real gateway wheels into the simulated package index (which rescans its folder)."""
    wheels = fleet.simdir / "wheels"
    for whl in CACHE.glob("*.whl"):
        if not (wheels / whl.name).exists():
            shutil.copy2(whl, wheels / whl.name)


def _members(base: str) -> dict[str, str]:
    status, body = _call(base + "/workers", ADMIN_KEY)
    assert status == 200, body
    return {w["url"]: w.get("status") for w in body["workers"]}


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _refused_launch_leaves_the_old_one(inventory: Path, base: str, tmp_path: Path) -> None:
    """(b) argparse takes `--health-check-interval-secs 0`; smg's RouterConfig::validate()
    refuses it at start (validation.rs:1700-1741): the probe start on a spare port fails the
    stage, the running gateway is not touched."""
    out = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", selection=Selection(
        only=["gateway"]), cli_vars={**KEYS, "gateway_extra_args":
                                     ["--health-check-interval-secs", "0"]})
    assert out.exit_code == 1
    error = out.summary.hosts[GATEWAY].stages["gateway"].error
    assert "smg refuses the launch (start" in error and "Must be >= 1" in error, error
    assert set(_members(base).values()) == {"ready"} and len(_members(base)) == 3
    assert _chat(base, API_KEY) == 200


def _membership_repaired(inventory: Path, base: str, urls: dict[str, str],
                         tmp_path: Path) -> None:
    """(c) a worker removed behind our back: not `ok` (dry run: would change) until a plain
    deploy adds it back."""
    gone = urls["gpu-2"]
    wid = next(w["id"] for w in _call(base + "/workers", ADMIN_KEY)[1]["workers"]
               if w["url"] == gone)
    assert _call(f"{base}/workers/{wid}", ADMIN_KEY, "DELETE")[0] == 202
    _wait(lambda: gone not in _members(base))
    plan = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", cli_vars=KEYS,
                  options=RunOptions(dry_run=True))
    gw = plan.summary.hosts[GATEWAY].stages["gateway"]
    assert plan.statuses(GATEWAY)["gateway"] == "would-change", plan.statuses(GATEWAY)
    assert f"membership differs: missing {gone}" in (gw.reason or ""), gw
    fixed = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", cli_vars=KEYS)
    assert fixed.exit_code == 0, fixed.summary
    assert fixed.statuses(GATEWAY)["gateway"] == "changed"
    assert fixed.summary.hosts[GATEWAY].facts["gateway"]["membership"] == [f"added {gone}"]
    assert _members(base) == {u: "ready" for u in urls.values()}
    again = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", cli_vars=KEYS)
    assert again.statuses(GATEWAY)["gateway"] == "ok"


def test_a_keyed_fleet_behind_the_real_gateway(tmp_path: Path) -> None:
    fleet = SimFleet.up(tmp_path / "sim", hosts=4, time_scale=SCALE)
    try:
        _seed_index(fleet)
        inventory, base, urls = _inventory(fleet, tmp_path / "inventory.yaml")
        # (d) a non-loopback bind without keys is refused before any host is touched
        with pytest.raises(ConfigError, match="not a loopback address"):
            deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs",
                   cli_vars={"gateway_host": "0.0.0.0"})
        t0 = time.monotonic()
        one = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", cli_vars=KEYS)
        print(f"first deploy of 3 keyed replicas + gateway: {time.monotonic() - t0:.1f}s")
        assert one.exit_code == 0, one.summary
        assert one.statuses(GATEWAY) == {"gateway_venv": "changed",
                                         "gateway_packages": "changed", "gateway": "changed"}
        facts = one.summary.hosts[GATEWAY].facts["gateway"]
        assert facts["smg_version"] == "1.13.0" and len(facts["ready_workers"]) == 3
        pin = json.loads(one.pin_path.read_text())["stages"]["gateway"]  # type: ignore[union-attr]
        assert pin == {"smg_version": "1.13.0", "policy": "round_robin", "extra_args": [],
                       "bind": "loopback"}
        # (a) worker management and chats need their keys; the replicas answer the gateway's
        assert _call(base + "/workers")[0] == 401
        assert _call(base + "/workers", API_KEY)[0] == 401
        assert _call(base + "/workers", None, "POST", {"url": "http://127.0.0.1:9"})[0] == 401
        assert _chat(base, None) == 401 and _chat(base, API_KEY) == 200
        assert _members(base) == {u: "ready" for u in urls.values()}
        # `orchestrator status --limit gateway`: running, its members each Ready (exit 0)
        rows = collect_status(resolve_targets(str(inventory), limit=["gateway"], cli_vars=KEYS))
        gw_row = next(r for r in rows if r["host"] == f"{GATEWAY}:gateway")
        assert gw_row["state"] == "running" and gw_row["ready"], gw_row
        assert sorted(m["url"] for m in gw_row["members"]) == sorted(urls.values())
        assert "members 3/3 ready" in gw_row["detail"] and status_exit_code(rows) == 0

        _refused_launch_leaves_the_old_one(inventory, base, tmp_path)
        _membership_repaired(inventory, base, urls, tmp_path)

        roll = Roll()
        with Load(base) as load:
            time.sleep(0.5)
            launch = yaml.safe_load(PROFILE.read_text())["launch"]
            two = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", handlers=[roll],
                         cli_vars={**KEYS, "launch": {**launch, "mem_fraction_static": 0.87}})
            time.sleep(0.5)
        print(f"plain deploy of a changed launch under load: {load.sent} requests, "
              f"{len(load.failed)} failed")
        assert two.exit_code == 0, two.summary
        assert load.failed == [] and load.sent > 20
        steps = [(e.host, e.step) for e in roll.steps]
        for h in REPLICAS:
            assert [s for host, s in steps if host == h] == [
                "removed", "drained", "redeployed", "added", "serving"], steps
        assert _members(base) == {u: "ready" for u in urls.values()}
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)
