"""The gateway kind (SMG): parameters (a non-loopback bind without both keys is refused), worker
URLs from an inventory group, and - with the REAL smg 1.13.0 wheel
from .cache/gateway-wheels installed in a venv here - a keyed gateway launched on this host
(worker management refused without the control-plane key, no key on any argv or in the log),
membership that differs keeping the stage Needed, and a launch that smg refuses only at start
failing the stage while the old gateway keeps serving, and a SIGKILLed gateway started again by
its supervisor. SMG's shapes alone:
tests/sglang/test_gateway.py; the launcher: tests/remote/test_gateway_launch.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.config.model import HostSpec
from orchestrator.errors import StageError
from orchestrator.stages.base import Converged, Needed, inventory_groups
from orchestrator.stages.gateway import GatewayParams, GatewayStage, worker_urls
from scripts.fetch_gateway_wheels import CACHE, HINT, have_wheels

API_KEY, CONTROL_KEY = "data-key-canary-4711", "admin-key-canary-0815"


def _params(**kw: object) -> GatewayParams:
    base: dict[str, object] = {"python": "/v/bin/python", "state_dir": "/s"}
    return GatewayParams.model_validate({**base, **kw})


def test_worker_urls_from_an_inventory_group() -> None:
    from orchestrator.config.model import GroupSpec, Inventory

    inv = Inventory(hosts={"gpu-1": HostSpec(address="10.0.0.1"), "gpu-2": HostSpec(),
                           "lb": HostSpec(groups=["gateway"])},
                    groups={"replicas": GroupSpec(hosts=["gpu-1", "gpu-2"])})
    groups = inventory_groups(inv)
    assert groups == {"replicas": ["gpu-1", "gpu-2"], "gateway": ["lb"]}
    p = _params(worker_group="replicas", worker_port=30001, workers=["http://extra:1/"])
    assert worker_urls(p, groups, dict(inv.hosts)) == {
        "gpu-1": "http://10.0.0.1:30001", "gpu-2": "http://gpu-2:30001",
        "http://extra:1": "http://extra:1"}
    with pytest.raises(StageError, match="not an inventory group"):
        worker_urls(_params(worker_group="nope"), groups, dict(inv.hosts))


def test_parameters_refused() -> None:
    with pytest.raises(ValidationError, match="policy must be one of"):
        _params(workers=["http://a:1"], policy="fastest")
    with pytest.raises(ValidationError, match="worker_group"):
        _params()
    p = _params(workers=["http://a:1"], drain_timeout="2m", api_key="", control_plane_key="")
    assert (p.drain_timeout, p.api_key, p.control_plane_key, p.host) == \
        (120.0, None, None, "127.0.0.1")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "gw.example"])
def test_a_non_loopback_bind_without_both_keys_is_refused(host: str) -> None:
    for keys in ({}, {"api_key": "k"}, {"control_plane_key": "c"}):
        with pytest.raises(ValidationError, match="not a loopback address.*needs both "
                           "`api_key`.*and `control_plane_key`.*or bind 127.0.0.1"):
            _params(workers=["http://a:1"], host=host, **keys)
    assert _params(workers=["http://a:1"], host=host, api_key="k",
                   control_plane_key="c").host == host
    for loopback in ("127.0.0.1", "127.0.3.4", "::1", "localhost"):
        assert _params(workers=["http://a:1"], host=loopback).api_key is None


PLAYBOOK = """
name: fleet
hosts: replicas
stages:
  - id: serve
    run: "true"
  - id: gateway
    hosts: lb
    uses: gateway
    with: {python: /v/bin/python, worker_group: replicas, state_dir: /s}
"""
INVENTORY = """
hosts:
  a: {connection: local}
  b: {connection: local}
  c: {connection: local}
  lb: {connection: local}
groups:
  replicas: {hosts: [a, b, c]}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_gateway_that_exits_at_once_fails_verify_with_its_log(
        local_host: Any, stage_ctx: Any, tmp_path: Path) -> None:
    """The launcher dies at start (here: no smg in that venv): verify says so with the log's
    last lines, not after ready_timeout."""
    stage = GatewayStage(_params(python=sys.executable, workers=["http://127.0.0.1:9"],
                                 port=_free_port(), state_dir=str(tmp_path / "gw"),
                                 ready_timeout=60))
    ctx = stage_ctx("gateway", kind="gateway")
    verdict = stage.check(local_host, ctx)
    assert isinstance(verdict, Needed) and "smg not installed yet" in verdict.reason
    with pytest.raises(StageError, match="smg does not import"):
        stage.apply(local_host, ctx, verdict.plan)  # the probe start refuses before anything


def test_a_foreign_process_on_the_port_is_refused(
        local_host: Any, stage_ctx: Any, tmp_path: Path) -> None:
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()

        def hang_up() -> None:  # answer the /health probe at once, with a closed connection
            while True:
                try:
                    s.accept()[0].close()
                except OSError:
                    return

        threading.Thread(target=hang_up, daemon=True).start()
        stage = GatewayStage(_params(workers=["http://127.0.0.1:9"], port=s.getsockname()[1],
                                     state_dir=str(tmp_path / "gw")))
        with pytest.raises(StageError, match="a process not started by us"):
            stage.check(local_host, stage_ctx("gateway", kind="gateway"))


# -- the real smg ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smg_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv with the real smg 1.13.0 (from the wheel cache, no network)."""
    if not have_wheels():
        pytest.skip(HINT)
    venv = tmp_path_factory.mktemp("smg") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(CACHE), "smg==1.13.0"],
                   check=True, timeout=300)
    return str(venv / "bin/python")


def _get(url: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # refused: nothing listens (URLError is an OSError)
        return 0, str(exc)


def _pid_tree_cmdlines() -> list[bytes]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((d / "cmdline").read_bytes())
            except OSError:
                pass
    return out


def test_the_real_gateway_keyed_refusing_and_left_serving(
        smg_python: str, local_host: Any, stage_ctx: Any, tmp_path: Path) -> None:
    port = _free_port()
    kw = {"python": smg_python, "workers": ["http://127.0.0.1:9"], "port": port,
          "prometheus_port": _free_port(), "state_dir": str(tmp_path / "gw"),
          "api_key": API_KEY, "control_plane_key": CONTROL_KEY, "ready_timeout": 5}
    stage = GatewayStage(_params(**kw))
    ctx = stage_ctx("gateway", kind="gateway")
    verdict = stage.check(local_host, ctx)
    assert isinstance(verdict, Needed) and verdict.reason.startswith("not running")
    try:
        stage.apply(local_host, ctx, verdict.plan)
        # its one worker never answers: verify says which member is missing, and so does check
        with pytest.raises(StageError, match="missing http://127.0.0.1:9"):
            stage.verify(local_host, ctx)
        again = stage.check(local_host, stage_ctx("gateway", kind="gateway"))
        assert isinstance(again, Needed), again
        assert again.reason == "membership differs: missing http://127.0.0.1:9"
        base = f"http://127.0.0.1:{port}"
        assert _get(base + "/health")[0] == 200
        assert _get(base + "/workers")[0] == 401  # no Bearer: refused
        assert _get(base + "/workers", API_KEY)[0] == 401  # the data-plane key is not admin
        assert json.loads(_get(base + "/workers", CONTROL_KEY)[1])["workers"] == []
        state = tmp_path / "gw"
        for name in ("api_key", "control_plane_key"):
            assert (state / name).stat().st_mode & 0o777 == 0o600
        launch = json.loads((state / "launch.json").read_text())
        assert launch["restart"]["max"] == 5 and len(launch["key_files"]) == 2
        assert not any(API_KEY.encode() in c or CONTROL_KEY.encode() in c
                       for c in _pid_tree_cmdlines())
        pid = json.loads((state / "server.pid").read_text())["pid"]

        # a launch argparse takes and smg refuses only at start (validation.rs:1700-1741)
        bad = GatewayStage(_params(**kw, health_check_interval=1,
                                   extra_args=["--health-check-interval-secs", "0"]))
        ctx2 = stage_ctx("gateway", kind="gateway")
        plan = bad.check(local_host, ctx2)
        assert isinstance(plan, Needed) and "different launch fingerprint" in plan.reason
        with pytest.raises(StageError, match=r"smg refuses the launch \(start.*"
                           r"health_check.check_interval_secs.*Must be >= 1"):
            bad.apply(local_host, ctx2, plan.plan)
        assert json.loads((state / "server.pid").read_text())["pid"] == pid
        assert _get(base + "/health")[0] == 200  # the old gateway still serves
        # SIGKILL of the gateway: its supervisor starts it again (backoff 1 s), same launch
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            record = json.loads((state / "server.pid").read_text())
            if record["pid"] != pid and _get(base + "/health")[0] == 200:
                break
            time.sleep(0.2)
        assert record["pid"] != pid and record["restarts"] == 1, record
        assert _get(base + "/health")[0] == 200
        assert json.loads(_get(base + "/workers", CONTROL_KEY)[1])["workers"] == []
        back = stage.check(local_host, stage_ctx("gateway", kind="gateway"))
        assert isinstance(back, Needed) and back.reason.startswith("membership differs"), back
        # smg's parser refuses an unknown flag already in check, before anything runs
        with pytest.raises(StageError, match=r"\(argparse.*unrecognized arguments: --nope"):
            GatewayStage(_params(**kw, extra_args=["--nope"])).check(
                local_host, stage_ctx("gateway", kind="gateway"))
    finally:
        local_host.act("server_stop", state_dir=str(tmp_path / "gw"), grace=10)
    log = (tmp_path / "gw" / "server.log").read_bytes()
    assert API_KEY.encode() not in log and CONTROL_KEY.encode() not in log
    assert b"gateway_launch: starting smg with 1 worker(s)" in log
    assert not isinstance(stage.check(local_host, stage_ctx("gateway", kind="gateway")),
                          Converged)
