"""The simulated hardware API (simhw) as the SGLang stand-in uses it, and cgroup v1 hosts."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator_sim import hypervisor as hv
from orchestrator_sim.hostenv.site import simhw
from orchestrator_sim.state import get_profile, new_state
from tests.sim.conftest import ssh_ok


@pytest.fixture
def box_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A box state file as `sim up` writes it, selected through SIM_HOST_STATE."""
    state = new_state(seed="t", box="gpu-1", profile=get_profile("rtx-pro-6000x8"),
                      roots={"gpu-1": str(tmp_path / "root")}, hypervisor="pve-1", ctid=101,
                      time_scale=0.01, load_seconds=960.0, conf_rules=None)
    hv.start_container(state, hv.conf_text("gpu-1", 101, state["kernel"]["uvm_major"], 8))
    path = tmp_path / "state.json"
    simhw.write_state(state, str(path))
    monkeypatch.setenv("SIM_HOST_STATE", str(path))
    monkeypatch.setenv("SIM_HOST_ROLE", "container")
    return path


def test_allocate_release_and_out_of_memory(box_state: Path):
    assert simhw.cuda_init() == 0 and simhw.device_count() == 8
    assert simhw.time_scale() == 0.01 and simhw.load_seconds() == 960.0
    pid = os.getpid()
    simhw.allocate(pid, 90000, list(range(8)))
    info = simhw.gpu_info()
    assert [g["memory_used_mib"] for g in info] == [90000] * 8
    assert info[0]["compute_capability"] == [12, 0]
    assert info[0]["pci_bus_id"] == "0000:18:00.0"
    with pytest.raises(simhw.OutOfMemory, match="Tried to allocate 8000 MiB"):
        simhw.allocate(pid, 8000, [3])
    simhw.allocate(pid, 7000, [3])  # 97887 - 90000 leaves room for 7000
    assert simhw.gpu_info()[3]["memory_used_mib"] == 97000
    procs = simhw.processes()
    assert {p["pid"] for p in procs} == {pid} and len(procs) == 8
    simhw.release(pid)
    assert all(g["memory_used_mib"] == 0 for g in simhw.gpu_info())


def test_memory_of_a_dead_process_is_collected(box_state: Path):
    code = ("import os, simhw; simhw.allocate(os.getpid(), 1234, [0, 1]); "
            "print(simhw.gpu_info()[1]['memory_used_mib'])")
    site = Path(simhw.__file__).parent
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.strip() == "1234"  # held while it lived...
    assert simhw.gpu_info()[1]["memory_used_mib"] == 0  # ...gone with the process


def test_uvm_rules(box_state: Path):
    state = simhw.read_state()
    major = state["kernel"]["uvm_major"]
    assert simhw.open_errno(state, "/dev/nvidia-uvm") is None
    state["container"]["allow"] = hv.rules_without(state["container"]["allow"], {major})
    assert simhw.open_errno(state, "/dev/nvidia-uvm") == 1  # EPERM
    state["container"]["allow"].append(f"c {major}:0 rwm")
    assert simhw.open_errno(state, "/dev/nvidia-uvm") is None
    assert simhw.open_errno(state, "/dev/nvidia-uvm-tools") == 1  # minor 1 not allowed
    state["kernel"]["uvm_major"] = major + 1 if major != 511 else 507  # stale node
    assert simhw.open_errno(state, "/dev/nvidia-uvm") == 6  # ENXIO


def test_cgroup_v1_devices_list(sim_factory):
    fleet = sim_factory(hosts=1, cgroup=1)
    code = "print(open('/sys/fs/cgroup/devices/devices.list').read())"
    before = ssh_ok(fleet, "gpu-1", f"python3 -c {shlex.quote(code)}")
    major = ssh_ok(fleet, "gpu-1", "python3 -c \"print([l.split()[0] for l in "
                   "open('/proc/devices') if 'nvidia-uvm' in l][0])\"").strip()
    assert "c 195:* rwm" in before.splitlines() and f"c {major}:* rwm" in before.splitlines()
    fleet.fault("gpu-1", "uvm-cgroup")
    after = ssh_ok(fleet, "gpu-1", f"python3 -c {shlex.quote(code)}")
    assert f"c {major}:* rwm" not in after.splitlines() and "c 195:* rwm" in after.splitlines()
