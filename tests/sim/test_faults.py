"""Each fault changes what the host's probes see, and `--off` (or the real fix) undoes it."""

from __future__ import annotations

import json
import re
import shlex
import socket
import time

import pytest

from orchestrator_sim.fleet import SimError
from tests.sim.conftest import marked_pids, ssh_ok

UVM = r"""
import json, os, errno, simhw
r = {"cuda": simhw.cuda_init()}
try:
    os.close(os.open("/dev/nvidia-uvm", os.O_RDWR)); r["open"] = "ok"
except OSError as e:
    r["open"] = errno.errorcode[e.errno]
r["proc"] = [int(l.split()[0]) for l in open("/proc/devices") if l.strip().endswith("nvidia-uvm")]
try:
    r["node"] = os.major(os.stat("/dev/nvidia-uvm").st_rdev)
except FileNotFoundError:
    r["node"] = None
print(json.dumps(r))
"""


def uvm(fleet, host="gpu-1") -> dict:
    return json.loads(ssh_ok(fleet, host, f"python3 -c {shlex.quote(UVM)}"))


def test_uvm_cgroup(shared_sim):
    assert uvm(shared_sim)["cuda"] == 0
    shared_sim.fault("gpu-1", "uvm-cgroup")
    try:
        assert len(ssh_ok(shared_sim, "gpu-1", "nvidia-smi -L").splitlines()) == 8
        r = uvm(shared_sim)
        assert r["cuda"] == 999 and r["open"] == "EPERM"
        assert r["node"] == r["proc"][0]  # the node is fine: only the cgroup says no
    finally:
        shared_sim.fault("gpu-1", "uvm-cgroup", on=False)
    assert uvm(shared_sim)["cuda"] == 0


def test_reboot_then_fix_through_the_hypervisor(sim_factory):
    fleet = sim_factory(hosts=1)
    before = uvm(fleet)
    ssh_ok(fleet, "gpu-1", "touch $TMPDIR/marker; setsid sleep 300 >/dev/null 2>&1 < /dev/null &")
    assert len(marked_pids(fleet.simdir)) == 1
    fleet.fault("gpu-1", "reboot", down_seconds=1.0)
    # down: connection refused on both the container and its hypervisor
    h = fleet.host("gpu-1")
    with pytest.raises(OSError):
        socket.create_connection((h["address"], h["port"]), timeout=1).close()
    assert fleet.ssh("pve-1", "true", timeout=10).returncode == 255
    assert marked_pids(fleet.simdir) == []  # every process of the box is gone
    deadline = time.monotonic() + 10
    while fleet.ssh("gpu-1", "true", timeout=10).returncode != 0:
        assert time.monotonic() < deadline, "host did not come back"
        time.sleep(0.1)
    assert ssh_ok(fleet, "gpu-1", "ls -A $TMPDIR").strip() == ""
    after = uvm(fleet)
    assert after["proc"][0] != before["proc"][0]  # major re-rolled
    assert after["node"] == after["proc"][0]  # node recreated with the new major
    assert after["cuda"] == 999 and after["open"] == "EPERM"  # cgroup kept the old major
    assert f"major device number {after['proc'][0]}" in ssh_ok(fleet, "gpu-1", "dmesg")
    # restarting alone does not help: the conf still names the old major
    ssh_ok(fleet, "pve-1", "pct stop 101 && pct start 101")
    assert uvm(fleet)["cuda"] == 999
    fix = (
        "import os, re\n"
        "major = [l.split()[0] for l in open('/proc/devices')\n"
        "         if l.strip().endswith('nvidia-uvm')][0]\n"
        "p = '/etc/pve/lxc/101.conf'\n"
        "text = open(p).read()\n"
        "text = re.sub(r'c (\\d+):\\* rwm', lambda m: m.group(0) if m.group(1) == '195' "
        "else 'c %s:* rwm' % major, text)\n"
        "tmp = p + '.tmp'\n"
        "with open(tmp, 'w') as f:\n"
        "    f.write(text)\n"
        "os.replace(tmp, p)\n"
    )
    ssh_ok(fleet, "pve-1", f"python3 -c {shlex.quote(fix)}")
    conf = (fleet.simdir / "hosts/pve-1/root/etc/pve/lxc/101.conf").read_text()
    assert f"c {after['proc'][0]}:* rwm" in conf
    assert uvm(fleet)["cuda"] == 999  # nothing changes until the container restarts
    ssh_ok(fleet, "pve-1", "pct stop 101")
    assert fleet.ssh("gpu-1", "true", timeout=10).returncode == 255  # stopped: no SSH
    ssh_ok(fleet, "pve-1", "pct start 101")
    r = uvm(fleet)
    assert r["cuda"] == 0 and r["open"] == "ok"


def test_gpu_missing(shared_sim):
    shared_sim.fault("gpu-2", "gpu-missing")
    try:
        assert len(ssh_ok(shared_sim, "gpu-2", "nvidia-smi -L").splitlines()) == 7
        code = "print(open('/var/log/kern.log').read())"
        kern = ssh_ok(shared_sim, "gpu-2", f"python3 -c {shlex.quote(code)}")
        assert re.search(r"NVRM: Xid \(PCI:0000:[0-9a-f]{2}:00\): 79, .*GPU has fallen off the bus",
                         kern)
        assert "Xid" in ssh_ok(shared_sim, "gpu-2", "dmesg")
        assert ssh_ok(shared_sim, "gpu-2", "python3 -c 'import simhw; print(simhw.device_count())'"
                      ).strip() == "7"
    finally:
        shared_sim.fault("gpu-2", "gpu-missing", on=False)
    assert len(ssh_ok(shared_sim, "gpu-2", "nvidia-smi -L").splitlines()) == 8


def test_stale_server_holds_port_and_memory_until_killed(shared_sim):
    rec = shared_sim.fault("gpu-2", "stale-server", mib=50000)
    h = shared_sim.host("gpu-2")
    socket.create_connection((h["address"], 30000), timeout=2).close()
    ps = ssh_ok(shared_sim, "gpu-2", f"cat /proc/{rec['pid']}/cmdline | tr '\\0' ' '")
    assert "-m sglang.launch_server" in ps and "--port 30000" in ps
    used = ssh_ok(shared_sim, "gpu-2", "nvidia-smi --query-gpu=memory.used "
                  "--format=csv,noheader,nounits").split()
    assert used == ["50000"] * 8
    apps = ssh_ok(shared_sim, "gpu-2", "nvidia-smi --query-compute-apps=pid,used_memory "
                  "--format=csv,noheader,nounits").splitlines()
    assert apps[0] == f"{rec['pid']}, 50000" and len(apps) == 8
    # the product's remedy: kill it; its memory is released (GC of dead pids)
    ssh_ok(shared_sim, "gpu-2", f"kill -9 {rec['pid']}")
    deadline = time.monotonic() + 5
    while ssh_ok(shared_sim, "gpu-2", "nvidia-smi --query-gpu=memory.used "
                 "--format=csv,noheader,nounits").split() != ["0"] * 8:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    shared_sim.fault("gpu-2", "stale-server", on=False)


def test_shm_small_and_disk_full(shared_sim):
    code = ("import os, shutil; v = os.statvfs('/dev/shm'); "
            "print(v.f_blocks * v.f_frsize // 2**20, "
            "shutil.disk_usage(os.environ['SIM_HOST_ROOT'] + '/opt').free // 2**20)")
    shm, free = map(int, ssh_ok(shared_sim, "gpu-1", f"python3 -c {shlex.quote(code)}").split())
    assert shm >= 65536 and free > 100
    shared_sim.fault("gpu-1", "shm-small")
    shared_sim.fault("gpu-1", "disk-full")
    try:
        out = ssh_ok(shared_sim, "gpu-1", f"python3 -c {shlex.quote(code)}").split()
        assert out == ["64", "100"]
    finally:
        shared_sim.fault("gpu-1", "shm-small", on=False)
        shared_sim.fault("gpu-1", "disk-full", on=False)


def test_no_pip(shared_sim):
    shared_sim.fault("gpu-1", "no-pip")
    try:
        res = shared_sim.ssh("gpu-1", "python3 -m venv $TMPDIR/v1")
        assert res.returncode == 1
        assert "ensurepip is not\navailable" in res.stdout and "python3-venv" in res.stdout
        res = shared_sim.ssh("gpu-1", "python3 -m ensurepip")
        assert res.returncode == 1 and "No module named ensurepip" in res.stderr
        ssh_ok(shared_sim, "gpu-1", "python3 -m venv --without-pip $TMPDIR/v2 && "
               "test -x $TMPDIR/v2/bin/python && ! test -e $TMPDIR/v2/bin/pip")
        res = shared_sim.ssh("gpu-1", "$TMPDIR/v2/bin/python -m ensurepip --upgrade")
        assert res.returncode == 1
    finally:
        shared_sim.fault("gpu-1", "no-pip", on=False)
        ssh_ok(shared_sim, "gpu-1", "rm -rf $TMPDIR/v1 $TMPDIR/v2")


def test_ssh_flaky_cuts_sessions(shared_sim):
    shared_sim.fault("gpu-2", "ssh-flaky", rate=1.0, within=0.3)
    try:
        res = shared_sim.ssh("gpu-2", "sleep 2; echo survived", timeout=20)
        assert res.returncode == 255 and "survived" not in res.stdout
    finally:
        shared_sim.fault("gpu-2", "ssh-flaky", on=False)
    assert ssh_ok(shared_sim, "gpu-2", "sleep 0.5; echo ok").strip() == "ok"


def test_driver_faults(shared_sim):
    shared_sim.fault("gpu-1", "driver-old")
    try:
        assert ssh_ok(shared_sim, "gpu-1", "python3 -c 'import simhw; print(simhw.cuda_init())'"
                      ).strip() == "35"
    finally:
        shared_sim.fault("gpu-1", "driver-old", on=False)
    shared_sim.fault("gpu-1", "driver-gone")
    try:
        res = shared_sim.ssh("gpu-1", "nvidia-smi")
        assert res.returncode == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout
    finally:
        shared_sim.fault("gpu-1", "driver-gone", on=False)


def test_uvm_node_missing_fixed_by_modprobe_and_restart(sim_factory):
    fleet = sim_factory(hosts=1)
    fleet.fault("gpu-1", "uvm-node-missing")
    r = uvm(fleet)
    assert r["node"] is None and r["proc"] == [] and r["cuda"] == 999
    ssh_ok(fleet, "pve-1", "nvidia-modprobe -u -c=0 && pct reboot 101")
    r = uvm(fleet)
    assert r["cuda"] == 0 and r["node"] == r["proc"][0]


def test_unknown_fault_and_host_say_what_exists(shared_sim):
    with pytest.raises(SimError, match="known faults: reboot"):
        shared_sim.fault("gpu-1", "melt")
    with pytest.raises(SimError, match="hosts: gpu-1"):
        shared_sim.fault("gpu-9", "no-pip")


def test_hub_faults_switch_the_shared_hub(sim_factory):
    fleet = sim_factory(hosts=1, hub=True)
    url = fleet.info()["hub_url"]
    if url is None:
        pytest.skip("the model hub module is not available")
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n"
            "    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code, e.headers.get('X-Error-Code'))\n")
    probe = f"python3 -c {shlex.quote(code)} {url}/api/models/moonshotai/Kimi-K2.6"
    assert ssh_ok(fleet, "gpu-1", probe).strip() == "200"
    fleet.fault("hub", "hub-gated")
    assert fleet.status()["hub_faults"] == ["hub-gated"]
    assert ssh_ok(fleet, "gpu-1", probe).strip() == "401 GatedRepo"
    fleet.fault("hub", "hub-gated", on=False)
    assert ssh_ok(fleet, "gpu-1", probe).strip() == "200"
