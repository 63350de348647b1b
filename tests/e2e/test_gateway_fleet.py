"""Replicas behind the REAL SGLang router (PyPI sglang-router 0.3.2, its Rust binary) on simulated
hosts: a 3-replica fleet deploys and serves through the router, then a rolling redeploy that
changes every replica's launch fingerprint runs while clients send requests through the router,
and not one request fails.

The router's wheel and its dependencies come from .cache/router-wheels/ (`make router-wheels`,
once, from PyPI); they are copied into the simulator's package index, so the router host installs
them with real pip and no network. Without them this module skips.
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
from orchestrator.events import EventHandler, ReplicaRoll, StageFinished
from orchestrator.options import RollingOptions
from orchestrator.plan import Selection
from orchestrator_sim.fleet import SimFleet
from scripts.fetch_router_wheels import CACHE, have_wheels
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "playbooks/kimi-k2.6-router.yaml"
PROFILE = REPO / "configs/models/kimi-k2.6.yaml"
SCALE = 0.001
REPLICAS = ["gpu-1", "gpu-2", "gpu-3"]
ROUTER = "gpu-4"
ROUTER_PORT = 30080

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not have_wheels(), reason=f"no sglang-router wheel in {CACHE}: run `make router-wheels` "
    "(downloads the real wheel from PyPI once)")]


class Collector(EventHandler):
    """Stage results and roll steps."""

    def __init__(self) -> None:
        self.finished: list[StageFinished] = []
        self.roll: list[ReplicaRoll] = []

    def on_stage_finished(self, e: StageFinished) -> None:
        self.finished.append(e)

    def on_replica_roll(self, e: ReplicaRoll) -> None:
        self.roll.append(e)


class Load:
    """Clients sending chat completions through the router until stopped."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url = url
        self.sent = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True)
                        for _ in range(clients)]

    def _client(self) -> None:
        body = json.dumps({"model": "kimi-k2.6", "max_tokens": 16, "temperature": 0,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.is_set():
            req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            error = None
            try:
                with opener.open(req, timeout=60) as resp:
                    if resp.status != 200 or not json.loads(resp.read())["choices"]:
                        error = f"status {resp.status}"
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                error = repr(exc)
            with self.lock:
                self.sent += 1
                if error:
                    self.failed.append(error)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def _inventory(fleet: SimFleet, path: Path) -> tuple[Path, str]:
    """The simulator's inventory plus the groups `replicas` and `router`."""
    inv = yaml.safe_load(fleet.inventory_path.read_text())
    inv["groups"]["replicas"] = {"hosts": REPLICAS}
    inv["groups"]["router"] = {"hosts": [ROUTER]}
    address = inv["hosts"][ROUTER]["address"]
    inv["hosts"][ROUTER]["vars"]["router_host"] = address
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path, f"http://{address}:{ROUTER_PORT}"


def _seed_index(fleet: SimFleet) -> None:
    """The real router wheels into the simulated package index (which rescans its folder)."""
    wheels = fleet.simdir / "wheels"
    for whl in CACHE.glob("*.whl"):
        if not (wheels / whl.name).exists():
            shutil.copy2(whl, wheels / whl.name)


def _changed_launch() -> dict[str, Any]:
    """The profile's `launch` with another mem_fraction_static: a new launch fingerprint."""
    launch = yaml.safe_load(PROFILE.read_text())["launch"]
    return {"launch": {**launch, "mem_fraction_static": 0.87}}


def _router_workers(router_url: str) -> dict[str, bool]:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            router_url + "/workers", timeout=10) as resp:
        return {w["url"]: w["is_healthy"] for w in json.loads(resp.read())["workers"]}


def _failed_roll_stops_and_the_others_serve(inventory: Path, router_url: str,
                                            tmp_path: Path) -> None:
    """A launch the preflight refuses: the first replica fails, stays out of the router, the
    roll stops and the two others keep serving (no request lost); a good roll, two replicas at a
    time, brings it back."""
    bad = _changed_launch()
    bad["launch"]["extra_args"] = ["--no-such-flag"]
    seen = Collector()
    t0 = time.monotonic()
    with Load(router_url, clients=2) as load:
        out = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", handlers=[seen],
                     cli_vars=bad, rolling=RollingOptions())
        workers = _router_workers(router_url)
    steps = [(e.host, e.step, e.duration_s) for e in seen.roll]
    print(f"failed roll: {load.sent} requests, {len(load.failed)} failed, "
          f"{time.monotonic() - t0:.1f}s; steps {steps}")
    assert out.exit_code == 1
    assert out.statuses("gpu-1")["server"] == "failed"
    for h in REPLICAS[1:]:
        assert set(out.statuses(h).values()) == {"skipped"}, out.statuses(h)
    assert [(e.host, e.step) for e in seen.roll][-1] == ("gpu-1", "failed")
    hosts = yaml.safe_load(inventory.read_text())["hosts"]
    assert sorted(workers) == [f"http://{hosts[h]['address']}:30000" for h in REPLICAS[1:]]
    assert all(workers.values()) and load.failed == [] and load.sent > 0

    again = Collector()
    t0 = time.monotonic()
    back = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", handlers=[again],
                  cli_vars=_changed_launch(), rolling=RollingOptions(max_unavailable=2))
    print(f"recovery roll: {time.monotonic() - t0:.1f}s; "
          f"steps {[(e.host, e.step, e.duration_s) for e in again.roll]}")
    assert back.exit_code == 0, back.summary
    steps = [(e.host, e.step) for e in again.roll]
    assert {h for h, st in steps if st == "serving"} == set(REPLICAS)
    # --max-unavailable 2: gpu-1 and gpu-2 together, gpu-3 only once both serve again
    assert steps.index(("gpu-3", "removed")) > max(steps.index(("gpu-1", "serving")),
                                                   steps.index(("gpu-2", "serving")))
    assert len(_router_workers(router_url)) == 3

    # a launch the installed router's own parser refuses fails in check: the router keeps serving
    refused = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", selection=Selection(
        only=["router"]), cli_vars={**_changed_launch(), "router_extra_args": ["--no-such"]})
    assert refused.exit_code == 1
    error = refused.summary.hosts[ROUTER].stages["router"].error
    assert "sglang-router refuses the launch (argparse)" in error, error
    assert "unrecognized arguments: --no-such" in error
    assert len(_router_workers(router_url)) == 3


def test_replicas_behind_the_real_router_roll_without_losing_a_request(tmp_path: Path) -> None:
    fleet = SimFleet.up(tmp_path / "sim", hosts=4, time_scale=SCALE)
    try:
        _seed_index(fleet)
        inventory, router_url = _inventory(fleet, tmp_path / "inventory.yaml")
        first = Collector()
        t_first = time.monotonic()
        one = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", handlers=[first])
        slowest = sorted(first.finished, key=lambda e: -e.duration_s)[:6]
        print(f"first deploy of {len(REPLICAS)} replicas + router: "
              f"{time.monotonic() - t_first:.1f}s; slowest stages "
              + ", ".join(f"{e.host}/{e.stage} {e.duration_s:.1f}s" for e in slowest))
        assert one.exit_code == 0, one.summary
        assert one.statuses(ROUTER) == {"router_venv": "changed", "router_packages": "changed",
                                        "router": "changed"}
        # the handler got every (host, stage) result as a typed event, as the record has it
        assert {(e.host, e.stage): e.status for e in first.finished} == {
            (h, stage): status for h in [*REPLICAS, ROUTER]
            for stage, status in one.statuses(h).items()}
        for h in REPLICAS:
            assert one.statuses(h)["server"] == "changed"
        facts = one.summary.hosts[ROUTER].facts["router"]
        assert facts["sglang_router_version"] == "0.3.2"
        assert len(facts["ready_workers"]) == 3
        pin = json.loads(one.pin_path.read_text())["stages"]["router"]  # type: ignore[union-attr]
        assert pin == {"sglang_router_version": "0.3.2", "policy": "round_robin",
                       "extra_args": [], "bind": "loopback"}
        locked = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", pin_path=one.pin_path,
                        selection=Selection(only=["router"]), cli_vars={"router_policy": "random"})
        assert locked.exit_code == 1
        assert "policy: this deploy would give random, the pin has round_robin" in \
            locked.summary.hosts[ROUTER].stages["router"].error

        seen = Collector()
        t0 = time.monotonic()
        with Load(router_url) as load:
            time.sleep(0.5)  # traffic flows before the roll starts
            two = deploy(PLAYBOOK, inventory, run_dir=tmp_path / "runs", handlers=[seen],
                         cli_vars=_changed_launch(), rolling=RollingOptions(max_unavailable=1))
            time.sleep(0.5)
        took = time.monotonic() - t0
        print(f"rolling redeploy of {len(REPLICAS)} replicas under load: {load.sent} requests "
              f"through the real router, {len(load.failed)} failed, {took:.1f}s")
        assert two.exit_code == 0, two.summary
        assert load.failed == [], load.failed[:5]
        assert load.sent > 20
        for h in REPLICAS:
            assert two.statuses(h)["server"] == "changed", two.statuses(h)
        assert two.statuses(ROUTER)["router"] == "ok"
        steps = [(e.host, e.step) for e in seen.roll]
        for h in REPLICAS:
            mine = [s for host, s in steps if host == h]
            assert mine == ["removed", "drained", "redeployed", "added", "serving"], mine
        # one at a time: a replica is back and serving before the next one leaves
        order = [h for h, s in steps if s in ("removed", "serving")]
        assert order == [h for h in REPLICAS for _ in range(2)], order
        assert {e.detail for e in seen.roll if e.step == "drained"} == {"0 requests in flight"}
        assert all(e.detail and e.detail.startswith("a request through the router reached it")
                   for e in seen.roll if e.step == "serving")

        _failed_roll_stops_and_the_others_serve(inventory, router_url, tmp_path)
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)
