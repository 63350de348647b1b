"""Shared fixtures for the stage-kind tests: real hosts, a StageContext, the runner's sequence.

sim_factory  tests/sim/conftest.py's factory of simulators (stopped and checked at the end)
sim_index    tests/sim/conftest_index.py's package index over the stand-in wheels (session;
             tests/conftest.py provides it)
local_host   a `connection: local` Host (the real agent as a subprocess); closed after the test
open_host    factory: open_host(spec, variables=None) -> Host over the transport the spec names
             (an SSH spec from a simulator's inventory works); every host is closed at the end
sim_host     factory: sim_host(fleet, "gpu-1") -> Host over SSH to a simulated host, built from
             the simulator's inventory (strict host keys), with its inventory vars
stage_ctx    factory: stage_ctx(stage_id="s", env=None, timeout=120) -> StageContext whose
             facts dict and progress messages (ctx.progress_messages) can be inspected
converge     converge(stage, host, ctx) -> ("ok" | "changed", reason): what the runner does
             (check; on Needed: apply(plan) then verify)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pip
import pytest
import structlog

from orchestrator.config.loader import load_inventory
from orchestrator.config.model import HostSpec, StageSpec
from orchestrator.host import Host
from orchestrator.result import Result
from orchestrator.stages.base import Converged, Stage, StageContext
from orchestrator.transports import make_transport
from tests.sim.conftest import sim_factory  # noqa: F401  (fixture: simulated hosts in tmp dirs)


@pytest.fixture
def open_host() -> Iterator[Callable[..., Host]]:
    opened: list[Host] = []

    def make(spec: HostSpec, variables: dict[str, Any] | None = None) -> Host:
        transport = make_transport(spec)
        transport.connect(budget=30)
        host = Host(spec, transport, variables if variables is not None else dict(spec.vars))
        opened.append(host)
        return host

    yield make
    for host in opened:
        host.transport.close()


@pytest.fixture
def local_host(open_host: Callable[..., Host]) -> Host:
    return open_host(HostSpec(name="localhost", connection="local"), {})


@pytest.fixture
def sim_host(open_host: Callable[..., Host]) -> Callable[..., Host]:
    def make(fleet: Any, name: str = "gpu-1") -> Host:
        inventory = load_inventory(fleet.inventory_path)
        spec = inventory.hosts[name].model_copy(update={"name": name})
        return open_host(spec, dict(spec.vars))

    return make


def _new_ctx(stage_id: str = "s", *, env: dict[str, str] | None = None,
             timeout: float | None = 120.0, kind: str = "shell",
             secrets: frozenset[str] = frozenset()) -> StageContext:
    messages: list[str] = []
    spec = StageSpec.model_validate({"id": stage_id, "uses": kind})
    ctx = StageContext(
        spec=spec, run_id="test", log=structlog.get_logger(f"stage.{kind}"),
        timeout=timeout, progress=messages.append, env=dict(env or {}), secrets=secrets,
    )
    ctx.progress_messages = messages  # type: ignore[attr-defined]
    return ctx


@pytest.fixture
def stage_ctx() -> Callable[..., StageContext]:
    return _new_ctx


def _converge(stage: Stage, host: Host, ctx: StageContext) -> tuple[str, str]:
    verdict = stage.check(host, ctx)
    if isinstance(verdict, Converged):
        return "ok", verdict.reason
    if verdict.plan is not None:  # as the runner does: apply gets what check decided
        stage.apply(host, ctx, verdict.plan)
    else:
        stage.apply(host, ctx)
    stage.verify(host, ctx)
    return "changed", verdict.reason


@pytest.fixture
def converge() -> Callable[[Stage, Host, StageContext], tuple[str, str]]:
    return _converge


@pytest.fixture
def commands(local_host: Host) -> list[Result]:
    """Every command the stages run on `local_host`, in order (probes are not commands)."""
    seen: list[Result] = []
    local_host._observer = seen.append
    return seen


def fast_venv(path: Path) -> Path:
    """A real venv with pip, made in well under a second: --without-pip + a copy of our pip."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=60)
    site = next((path / "lib").glob("python3*/site-packages"))
    src = Path(pip.__file__).parent
    shutil.copytree(src, site / "pip", ignore=shutil.ignore_patterns("__pycache__"))
    for info in src.parent.glob(f"pip-{pip.__version__}.dist-info"):
        shutil.copytree(info, site / info.name)
    return path / "bin" / "python"
