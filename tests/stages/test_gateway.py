"""The sglang_router kind: launch arguments held to the REAL launcher's parser of sglang-router
0.3.2 when its wheel is cached, worker URLs from an inventory group, parameter checks, the
rolling redeploy's set-up, and a router that exits or finds its port taken. The router's launch
and API shapes alone: tests/sglang/test_router.py."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.config.model import HostSpec
from orchestrator.errors import StageError
from orchestrator.sglang import router as rt
from orchestrator.stages.base import inventory_groups
from orchestrator.stages.sglang_router import SGLangRouterParams, worker_urls
from scripts.fetch_router_wheels import CACHE, VERSION, have_wheels


def _params(**kw: object) -> SGLangRouterParams:
    base: dict[str, object] = {"python": "/v/bin/python", "state_dir": "/s"}
    return SGLangRouterParams.model_validate({**base, **kw})


def _router_check(cwd: Path, args: list[str]) -> dict[str, object]:
    from orchestrator.remote import source

    r = subprocess.run([sys.executable, "-c", source("router_check"), json.dumps(args)],
                       cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1].removeprefix("ORCH_RESULT "))


@pytest.mark.skipif(not have_wheels(), reason=f"no sglang-router wheel in {CACHE}: run "
                    "`make router-wheels`")
def test_the_real_router_checks_our_arguments(tmp_path: Path) -> None:
    """remote/router_check.py runs the real wheel's RouterArgs parsing and validation (it imports
    only the compiled module): our arguments read back as meant, a bad one is refused."""
    wheel = next(CACHE.glob(f"sglang_router-{VERSION}-*.whl"))
    zipfile.ZipFile(wheel).extractall(tmp_path / "w")
    args = rt.router_args(["http://10.0.0.1:30000", "http://10.0.0.2:30000"],
                          policy="power_of_two", host="127.0.0.1", port=30080)
    assert _router_check(tmp_path / "w", args) == {"available": True, "ok": True, "fields": {
        "worker_urls": ["http://10.0.0.1:30000", "http://10.0.0.2:30000"],
        "policy": "power_of_two", "host": "127.0.0.1", "port": 30080}}
    bad = _router_check(tmp_path / "w", [*args, "--no-such-flag"])
    assert bad["ok"] is False and bad["kind"] == "argparse"
    assert "unrecognized arguments: --no-such-flag" in str(bad["message"])
    assert _router_check(tmp_path, args)["available"] is False  # no sglang_router here


def test_worker_urls_from_an_inventory_group() -> None:
    from orchestrator.config.model import GroupSpec, Inventory

    inv = Inventory(hosts={"gpu-1": HostSpec(address="10.0.0.1"), "gpu-2": HostSpec(),
                           "lb": HostSpec(groups=["router"])},
                    groups={"replicas": GroupSpec(hosts=["gpu-1", "gpu-2"])})
    groups = inventory_groups(inv)
    assert groups == {"replicas": ["gpu-1", "gpu-2"], "router": ["lb"]}
    p = _params(worker_group="replicas", worker_port=30001, workers=["http://extra:1/"])
    assert worker_urls(p, groups, dict(inv.hosts)) == {
        "gpu-1": "http://10.0.0.1:30001", "gpu-2": "http://gpu-2:30001",
        "http://extra:1": "http://extra:1"}
    with pytest.raises(StageError, match="not an inventory group"):
        worker_urls(_params(worker_group="nope"), groups, dict(inv.hosts))


def test_parameters_refused() -> None:
    with pytest.raises(ValidationError, match="policy must be one of"):
        _params(workers=["http://a:1"], policy="least_load")
    with pytest.raises(ValidationError, match="worker_group"):
        _params()
    assert _params(workers=["http://a:1"], drain_timeout="2m").drain_timeout == 120.0


PLAYBOOK = """
name: fleet
hosts: replicas
stages:
  - id: serve
    run: "true"
  - id: router
    hosts: lb
    uses: sglang_router
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


def _rolling_runner(tmp_path: Path, playbook: str, n: int) -> object:
    import orchestrator.stages  # noqa: F401 - registers the kinds
    from orchestrator.config import load_all
    from orchestrator.events import EventBus
    from orchestrator.options import RollingOptions
    from orchestrator.plan import Selection, build_plan, render_plan
    from orchestrator.run.rolling import RollingRun
    from orchestrator.run.state import RunState

    (tmp_path / "p.yaml").write_text(playbook)
    (tmp_path / "i.yaml").write_text(INVENTORY)
    pb, inv = load_all(str(tmp_path / "p.yaml"), str(tmp_path / "i.yaml"), {})
    rendered = render_plan(build_plan(pb, inv, Selection()))
    return RollingRun(RunState(rendered, EventBus("test")), RollingOptions(n))


def test_rolling_needs_one_router_and_a_replica_left_serving(tmp_path: Path) -> None:
    from orchestrator.errors import PlanError

    runner = _rolling_runner(tmp_path, PLAYBOOK, 2)
    assert runner.replicas == ["a", "b", "c"]  # type: ignore[attr-defined]
    assert runner.router.urls == {h: f"http://{h}:30000" for h in "abc"}  # type: ignore[attr-defined]
    with pytest.raises(PlanError, match="all 3 replicas"):
        _rolling_runner(tmp_path, PLAYBOOK, 3)
    without = PLAYBOOK.split("  - id: router")[0]
    with pytest.raises(PlanError, match="exactly one sglang_router"):
        _rolling_runner(tmp_path, without, 1)


def test_cli_rolling_flags() -> None:
    from orchestrator.cli.main import _rolling, build_parser
    from orchestrator.options import RollingOptions

    parse = build_parser("deploy").parse_args
    args = parse(["deploy", "p.yaml", "-i", "i.yaml", "--rolling", "--max-unavailable", "2"])
    assert _rolling(args) == RollingOptions(max_unavailable=2)
    assert _rolling(parse(["deploy", "p.yaml", "-i", "i.yaml"])) is None


def test_router_check_imported_without_the_router() -> None:
    """The host program, imported: where sglang_router does not import, it says so as data."""
    from orchestrator.remote import router_check

    verdict = router_check.check(["--policy", "round_robin"])
    assert verdict["available"] is False and verdict["kind"] == "ModuleNotFoundError"


def test_console_shows_roll_steps() -> None:
    import io

    from orchestrator.cli.console import ConsoleView
    from orchestrator.events import ReplicaRoll

    out = io.StringIO()
    view = ConsoleView(stream=out, live=False)
    view.on_replica_roll(ReplicaRoll(host="gpu-1", step="drained",
                                     detail="0 requests in flight", duration_s=0.21))
    view.on_replica_roll(ReplicaRoll(host="gpu-2", step="failed", detail="its stages failed"))
    view.close()
    assert "[gpu-1] rolling: drained: 0 requests in flight (0.2s)" in out.getvalue()
    assert "[gpu-2] rolling: failed: its stages failed" in out.getvalue()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_router_that_exits_at_once_fails_verify_with_its_log(
        local_host: object, stage_ctx: object, converge: object, tmp_path: Path) -> None:
    """The launcher dies at start (here: no sglang_router in that venv): verify says so with
    the log's last lines, not after ready_timeout."""
    from orchestrator.stages.sglang_router import SGLangRouter

    stage = SGLangRouter(_params(python=sys.executable, workers=["http://127.0.0.1:9"],
                                 port=_free_port(), state_dir=str(tmp_path / "router"),
                                 ready_timeout=60))
    ctx = stage_ctx("router", kind="sglang_router")  # type: ignore[operator]
    with pytest.raises(StageError, match="the router exited") as err:
        converge(stage, local_host, ctx)  # type: ignore[operator]
    assert "No module named 'sglang_router'" in str(err.value)


def test_a_foreign_process_on_the_port_is_refused(
        local_host: object, stage_ctx: object, tmp_path: Path) -> None:
    import socket
    import threading

    from orchestrator.stages.sglang_router import SGLangRouter

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
        stage = SGLangRouter(_params(workers=["http://127.0.0.1:9"], port=s.getsockname()[1],
                                     state_dir=str(tmp_path / "router")))
        ctx = stage_ctx("router", kind="sglang_router")  # type: ignore[operator]
        with pytest.raises(StageError, match="a process not started by us"):
            stage.check(local_host, ctx)  # type: ignore[arg-type]
