"""`orchestrator sim up|status|fault|down` as a user runs them (subprocess, real daemon)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config.model import Inventory
from orchestrator_sim.fleet import SimFleet
from tests.sim.conftest import TEST_SCALE, assert_nothing_left, pid_alive, run_cli, ssh_ok
from tests.sshd import openssh_missing


@pytest.fixture
def cli_dir(tmp_path: Path):
    simdir = tmp_path / "sim"
    yield simdir
    fleet = SimFleet(simdir)
    pid = fleet.info().get("pid")
    fleet.down()
    assert_nothing_left(simdir, pid)


def test_up_status_fault_down(cli_dir: Path):
    res = run_cli("up", "--dir", str(cli_dir), "--hosts", "2", "--time-scale", str(TEST_SCALE))
    assert res.returncode == 0, res.stderr
    assert "gpu-2" in res.stdout and "pve-2" in res.stdout
    fleet = SimFleet(cli_dir)
    info = fleet.info()

    # the inventory loads with the product's schema; host keys are checked strictly
    inv = Inventory.model_validate(yaml.safe_load((cli_dir / "inventory.yaml").read_text()))
    assert sorted(inv.group_members("gpu")) == ["gpu-1", "gpu-2"]
    assert sorted(inv.group_members("hypervisors")) == ["pve-1", "pve-2"]
    gpu1 = inv.hosts["gpu-1"]
    assert gpu1.host_key_policy == "strict" and gpu1.known_hosts == str(cli_dir / "known_hosts")
    assert gpu1.hypervisor is not None and gpu1.hypervisor.host == "pve-1"
    assert gpu1.hypervisor.ctid == 101
    assert gpu1.vars["sglang_port"] == 30000 and gpu1.vars["sglang_host"] == gpu1.address
    assert gpu1.vars["base_dir"].startswith(gpu1.vars["sim_root"])
    if info["index_url"]:
        assert gpu1.vars["pip_index_url"] == info["index_url"]
    if info["hub_url"]:
        assert gpu1.vars["hf_endpoint"] == info["hub_url"]
    known = (cli_dir / "known_hosts").read_text()
    for name, spec in inv.hosts.items():
        assert f"[{spec.address}]:{spec.port} ssh-ed25519 " in known
        assert len(ssh_ok(fleet, name, "nvidia-smi -L").splitlines()) == 8

    again = run_cli("up", "--dir", str(cli_dir))
    assert again.returncode == 1 and "already running" in again.stderr

    res = run_cli("fault", "--dir", str(cli_dir), "gpu-2", "shm-small")
    assert res.returncode == 0, res.stderr
    status = run_cli("status", "--dir", str(cli_dir))
    assert status.returncode == 0
    row = next(line for line in status.stdout.splitlines() if line.startswith("gpu-2"))
    assert "shm-small" in row and "up" in row
    data = json.loads(run_cli("status", "--dir", str(cli_dir), "--json").stdout)
    assert {h["name"] for h in data["hosts"]} == {"gpu-1", "gpu-2", "pve-1", "pve-2"}
    bad = run_cli("fault", "--dir", str(cli_dir), "gpu-2", "melt-down")
    assert bad.returncode == 1 and "known faults" in bad.stderr

    # something long-running on a host, detached from its SSH session
    ssh_ok(fleet, "gpu-1", "setsid nohup sleep 600 >/dev/null 2>&1 < /dev/null &")
    daemon = info["pid"]
    res = run_cli("down", "--dir", str(cli_dir))
    assert res.returncode == 0 and "stopped" in res.stdout
    assert_nothing_left(cli_dir, daemon)
    assert run_cli("status", "--dir", str(cli_dir)).returncode == 3


def test_openssh_sshd_mode(cli_dir: Path):
    if openssh_missing():
        pytest.skip(openssh_missing())
    res = run_cli("up", "--dir", str(cli_dir), "--sshd", "openssh", "--time-scale",
                  str(TEST_SCALE), "--no-index", "--no-hub")
    assert res.returncode == 0, res.stderr
    fleet = SimFleet(cli_dir)
    out = ssh_ok(fleet, "gpu-1", "nvidia-smi -L | wc -l; echo $SIM_HOST_NAME; "
                 "python3 -c 'import simhw; print(simhw.cuda_init())'")
    assert out.split() == ["8", "gpu-1", "0"]
    ssh_ok(fleet, "pve-1", "pct stop 101")
    assert fleet.ssh("gpu-1", "true", timeout=10).returncode == 255
    ssh_ok(fleet, "pve-1", "pct start 101")
    assert ssh_ok(fleet, "gpu-1", "echo back").strip() == "back"
    sshd_pids = [int(p.read_text().split()[0]) for p in cli_dir.glob("hosts/*/sshd.pid")]
    assert len(sshd_pids) == 2
    daemon = fleet.info()["pid"]
    assert run_cli("down", "--dir", str(cli_dir)).returncode == 0
    assert_nothing_left(cli_dir, daemon)
    assert not any(pid_alive(p) for p in sshd_pids)


def test_no_hypervisor_bare_hosts(cli_dir: Path):
    res = run_cli("up", "--dir", str(cli_dir), "--no-hypervisor", "--no-index", "--no-hub",
                  "--time-scale", str(TEST_SCALE))
    assert res.returncode == 0, res.stderr
    fleet = SimFleet(cli_dir)
    assert [h["name"] for h in fleet.info()["hosts"]] == ["gpu-1"]
    inv = Inventory.model_validate(yaml.safe_load((cli_dir / "inventory.yaml").read_text()))
    assert inv.hosts["gpu-1"].hypervisor is None
    code = "import os; print(os.path.exists('/sys/fs/cgroup/devices/devices.list'))"
    assert ssh_ok(fleet, "gpu-1", f"python3 -c \"{code}\"").strip() == "False"
    fleet.fault("gpu-1", "uvm-cgroup")
    assert ssh_ok(fleet, "gpu-1", "python3 -c 'import simhw; print(simhw.cuda_init())'"
                  ).strip() == "999"
    fleet.fault("gpu-1", "uvm-cgroup", on=False)
    assert ssh_ok(fleet, "gpu-1", "python3 -c 'import simhw; print(simhw.cuda_init())'"
                  ).strip() == "0"
    # a bare host has no hypervisor cgroup to go stale: after a reboot CUDA just works
    res = run_cli("fault", "--dir", str(cli_dir), "gpu-1", "reboot", "--wait",
                  "--down-seconds", "0.3")
    assert res.returncode == 0, res.stderr
    assert ssh_ok(fleet, "gpu-1", "python3 -c 'import simhw; print(simhw.cuda_init())'"
                  ).strip() == "0"
    off = run_cli("fault", "--dir", str(cli_dir), "gpu-1", "reboot", "--off")
    assert off.returncode == 1 and "nothing to switch off" in off.stderr
