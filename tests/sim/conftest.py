"""Fixtures for the simulated-host tests: real daemons, real OpenSSH clients, /proc scans."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.fleet import host_pids as marked_pids
from orchestrator_sim.procs import alive as pid_alive

TEST_SCALE = 0.001


def assert_nothing_left(simdir: Path, daemon_pid: int | None) -> None:
    deadline = time.monotonic() + 5
    while True:
        left = marked_pids(simdir)
        daemon = daemon_pid is not None and pid_alive(daemon_pid)
        if not left and not daemon:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: host processes {left}, daemon alive {daemon}")
        time.sleep(0.05)


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[Callable[..., SimFleet]]:
    """Start simulators in tmp dirs; every one is stopped and checked for leftovers."""
    started: list[SimFleet] = []

    def make(name: str = "sim", **options) -> SimFleet:
        options.setdefault("time_scale", TEST_SCALE)
        options.setdefault("index", False)
        options.setdefault("hub", False)
        fleet = SimFleet.up(tmp_path / name, **options)
        started.append(fleet)
        return fleet

    yield make
    for fleet in started:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    """One 2-host simulator per test module, for tests that leave it as they found it."""
    simdir = tmp_path_factory.mktemp("shared") / "sim"
    fleet = SimFleet.up(simdir, hosts=2, time_scale=TEST_SCALE, index=False, hub=False)
    yield fleet
    pid = fleet.info().get("pid")
    fleet.down()
    assert_nothing_left(simdir, pid)


def ssh_ok(fleet: SimFleet, host: str, command: str, timeout: float = 30) -> str:
    """Run through OpenSSH; assert exit 0; return stdout."""
    res = fleet.ssh(host, command, timeout=timeout)
    assert res.returncode == 0, f"{command!r} on {host}: rc={res.returncode}\n{res.stderr}"
    return res.stdout


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator_sim.cli", *args],
                          capture_output=True, text=True, timeout=timeout)
