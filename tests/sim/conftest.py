"""Fixtures for the simulated-host tests: real daemons, real OpenSSH clients, /proc scans."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.sim.fleet import SimFleet

TEST_SCALE = 0.001


def marked_pids(simdir: Path) -> list[int]:
    """Live (non-zombie) processes carrying this SIMDIR's SIM_HOST_ID marker."""
    prefix = b"SIM_HOST_ID=" + hashlib.sha1(str(simdir.resolve()).encode()).hexdigest()[
        :12].encode() + b":"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        if stat.rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):
            continue
        if any(item.startswith(prefix) for item in env.split(b"\0")):
            out.append(int(entry))
    return out


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")


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
    return subprocess.run([sys.executable, "-m", "orchestrator.sim.cli", *args],
                          capture_output=True, text=True, timeout=timeout)
