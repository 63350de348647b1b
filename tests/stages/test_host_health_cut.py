"""host_health's container restart (`pct stop && pct start` on the Proxmox hypervisor) survives
the hypervisor's SSH session being cut while it runs: the restart runs detached, and the stage
reconnects and waits for its result. Run as a plain command, a cut between the stop and the
start left the container stopped and the deploy waiting for it until its connect budget ran
out (found by the soak, scripts/soak.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.loader import load_inventory
from orchestrator.host import Host
from orchestrator.stages.host_health import _restart_detached
from orchestrator.transports import make_transport
from orchestrator_sim.fleet import SimFleet
from tests.sim.conftest import assert_nothing_left, pid_alive


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    simdir = tmp_path_factory.mktemp("restart_cut") / "sim"
    f = SimFleet.up(simdir, hosts=1, time_scale=0.001, index=False, hub=False)
    yield f
    pid = f.info().get("pid")
    f.down()
    assert_nothing_left(simdir, pid)


def open_host(fleet: SimFleet, name: str) -> Host:
    spec = load_inventory(fleet.inventory_path).hosts[name].model_copy(update={"name": name})
    transport = make_transport(spec)
    transport.connect(budget=30)
    return Host(spec, transport, dict(spec.vars))


def container_running(fleet: SimFleet) -> bool:
    return next(h for h in fleet.status()["hosts"] if h["name"] == "gpu-1")["running"]


def test_restart_finishes_when_the_hypervisor_session_is_cut(fleet: SimFleet) -> None:
    gpu = open_host(fleet, "gpu-1")
    sleeper = int(gpu.run("sleep 300 >/dev/null 2>&1 & echo $!").stdout)
    gpu.transport.close()
    pve = open_host(fleet, "pve-1")
    jobs = Path(fleet.host("pve-1")["root"]) / "root" / ".orchestrator"
    agent = int(pve.transport.agent_info["pid"])
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            _restart_detached(pve, 101, timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    worker = threading.Thread(target=restart)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not list(jobs.glob("pct-restart-101-*")):  # the restart has started
            assert time.monotonic() < deadline, "the restart job never started"
            time.sleep(0.005)
        os.kill(agent, signal.SIGHUP)  # what sshd does when the session drops
        worker.join(60)
    finally:
        pve.transport.close()
    assert not worker.is_alive()
    assert not errors, errors
    assert int(pve.transport.agent_info.get("pid") or 0) != agent or not pid_alive(agent)
    assert container_running(fleet)
    assert not pid_alive(sleeper)  # the container really was restarted
    assert not list(jobs.glob("pct-restart-101-*"))  # its job directory was cleaned up
    again = open_host(fleet, "gpu-1")  # and it answers SSH again
    try:
        assert again.run("echo back").stdout.strip() == "back"
    finally:
        again.transport.close()


def test_a_failing_restart_reports_pct_output(fleet: SimFleet) -> None:
    pve = open_host(fleet, "pve-1")
    try:
        with pytest.raises(Exception) as info:
            _restart_detached(pve, 999, timeout=30)
    finally:
        pve.transport.close()
    msg = str(info.value)
    assert "restarting container 999 on pve-1 failed" in msg
    assert "pct start 999" in msg and "999" in msg.split("output (last lines):")[-1]
    assert container_running(fleet)
