"""A simulated host reached with real SSH clients: OpenSSH and paramiko, strict host keys."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time

import paramiko
import pytest

from tests.sim.conftest import marked_pids, ssh_ok


def test_openssh_strict_host_keys_reach_every_host(shared_sim):
    for h in shared_sim.info()["hosts"]:
        out = ssh_ok(shared_sim, h["name"], "echo $SIM_HOST_NAME; pwd; echo $TMPDIR")
        name, pwd, tmp = out.split()
        assert name == h["name"]
        assert pwd == h["root"] + "/root"  # HOME inside the host's root
        assert tmp == h["root"] + "/tmp"
    # each host has its own loopback address
    addrs = {h["address"] for h in shared_sim.info()["hosts"]}
    assert len(addrs) == 4 and all(a.startswith("127.") for a in addrs)


def test_wrong_host_key_is_refused(shared_sim, tmp_path):
    h = shared_sim.host("gpu-1")
    other = shared_sim.host("gpu-2")
    # a known_hosts that pins gpu-2's key on gpu-1's address
    line = next(ln for ln in shared_sim.known_hosts.read_text().splitlines()
                if ln.startswith(f"[{other['address']}]"))
    bad = tmp_path / "known_hosts"
    bad.write_text(f"[{h['address']}]:{h['port']} " + " ".join(line.split()[1:]) + "\n")
    argv = shared_sim.ssh_argv("gpu-1", "true")
    argv[argv.index(f"UserKnownHostsFile={shared_sim.known_hosts}")] = f"UserKnownHostsFile={bad}"
    res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    assert res.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in res.stderr or "verification failed" in res.stderr


def test_exit_status_stdin_and_stderr(shared_sim):
    res = shared_sim.ssh("gpu-1", "cat; echo to-err >&2; exit 7", input="piped\n")
    assert res.returncode == 7
    assert res.stdout == "piped\n"
    assert res.stderr.strip().endswith("to-err")


def test_nvidia_smi_lists_eight_gpus(shared_sim):
    out = ssh_ok(shared_sim, "gpu-1", "nvidia-smi -L")
    lines = out.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-")
    q = ssh_ok(shared_sim, "gpu-1", "nvidia-smi --query-gpu=index,name,memory.total,memory.used,"
               "memory.free,driver_version,compute_cap,pci.bus_id,persistence_mode,"
               "ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits")
    first = [f.strip() for f in q.splitlines()[0].split(",")]
    assert first == ["0", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "97887", "0", "97887",
                     "580.95.05", "12.0", "00000000:18:00.0", "Enabled", "0"]
    header = ssh_ok(shared_sim, "gpu-1", "nvidia-smi --query-gpu=memory.total --format=csv")
    assert header.splitlines() == ["memory.total [MiB]"] + ["97887 MiB"] * 8
    bad = shared_sim.ssh("gpu-1", "nvidia-smi --query-gpu=bogus --format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout
    table = ssh_ok(shared_sim, "gpu-1", "nvidia-smi")
    assert "Driver Version: 580.95.05" in table and "CUDA Version: 13.0" in table
    assert all(len(line) == 91 for line in table.splitlines()[1:] if line.startswith(("|", "+")))


PROBE = r"""
import json, os, stat, errno
out = {}
out["devices"] = [l.split() for l in open("/proc/devices") if l.strip().endswith("nvidia-uvm")]
st = os.stat("/dev/nvidia-uvm")
out["uvm"] = [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)]
try:
    os.close(os.open("/dev/nvidia-uvm", os.O_RDWR))
    out["open"] = "ok"
except OSError as e:
    out["open"] = errno.errorcode[e.errno]
out["devices_list"] = os.path.exists("/sys/fs/cgroup/devices/devices.list")
out["nodes"] = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
import simhw
out["cuda"] = simhw.cuda_init()
out["count"] = simhw.device_count()
print(json.dumps(out))
"""


def test_python_on_the_host_sees_the_hardware_paths(shared_sim):
    out = json.loads(ssh_ok(shared_sim, "gpu-1", f"python3 -c {shlex.quote(PROBE)}"))
    major = int(out["devices"][0][0])
    assert 234 <= major <= 243 or 507 <= major <= 511
    assert out["uvm"] == [True, major, 0]
    assert out["open"] == "ok"
    assert out["devices_list"] is False  # cgroup v2: no readable file
    assert "nvidia-uvm" in out["nodes"] and "nvidia7" in out["nodes"]
    assert out["cuda"] == 0 and out["count"] == 8
    # the real files are untouched for everything else
    assert ssh_ok(shared_sim, "gpu-1", "python3 -c 'print(open(\"/etc/hostname\").read()!=\"\")'"
                  ).strip() == "True"


def test_pynvml_stand_in_and_nvml_absent_switch(shared_sim):
    code = (
        "import pynvml\n"
        "try:\n"
        "    pynvml.nvmlInit()\n"
        "except pynvml.NVMLError_LibraryNotFound as e:\n"
        "    print('absent', e); raise SystemExit(0)\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(3)\n"
        "m = pynvml.nvmlDeviceGetMemoryInfo(h)\n"
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h), m.total // 2**20,"
        " m.used, pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlSystemGetCudaDriverVersion_v2(),"
        " pynvml.nvmlDeviceGetCudaComputeCapability(h),"
        " pynvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,"
        " pynvml.NVML_VOLATILE_ECC), pynvml.nvmlDeviceGetPersistenceMode(h),"
        " pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),"
        " len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)))\n"
        "pynvml.nvmlShutdown()\n"
    )
    out = ssh_ok(shared_sim, "gpu-1", f"python3 -c {shlex.quote(code)}")
    assert out.strip() == (
        "8 NVIDIA RTX PRO 6000 Blackwell Server Edition 97887 0 580.95.05 13000 (12, 0) 0 1 5 16 0")
    shared_sim.fault("gpu-1", "nvml-absent")
    try:
        out = ssh_ok(shared_sim, "gpu-1", f"python3 -c {shlex.quote(code)}")
        assert out.strip() == "absent NVML Shared Library Not Found"
        # nvidia-smi keeps working for the product's fallback
        assert len(ssh_ok(shared_sim, "gpu-1", "nvidia-smi -L").splitlines()) == 8
    finally:
        shared_sim.fault("gpu-1", "nvml-absent", on=False)


def test_pynvml_stand_in_sees_changes_within_one_session(shared_sim):
    """The double re-reads the host state only when its file changed, and forgets the memory of
    a process that ended even though nothing rewrote the file (the driver frees it)."""
    code = (
        "import os, subprocess, sys, pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "used = lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20\n"
        "before = used()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, sys, time, simhw; "
        "simhw.allocate(os.getpid(), 1234, [0]); print(1, flush=True); time.sleep(60)'],"
        " stdout=subprocess.PIPE)\n"
        "child.stdout.readline()\n"
        "during = used()\n"
        "child.kill(); child.wait()\n"
        "print(before, during - before, used() - before)\n"
        "pynvml.nvmlShutdown()\n"
    )
    out = ssh_ok(shared_sim, "gpu-1", f"python3 -c {shlex.quote(code)}")
    assert out.split()[1:] == ["1234", "0"]


def _client(fleet, name: str) -> paramiko.SSHClient:
    h = fleet.host(name)
    client = paramiko.SSHClient()
    client.load_host_keys(str(fleet.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(h["address"], port=h["port"], username=fleet.info()["user"],
                   key_filename=str(fleet.identity_file), look_for_keys=False,
                   allow_agent=False, timeout=10)
    return client


def test_paramiko_env_requests_and_kill_on_channel_close(shared_sim):
    client = _client(shared_sim, "gpu-2")
    try:
        _, out, _ = client.exec_command("echo $SECRET_TOKEN $SIM_HOST_NAME",
                                        environment={"SECRET_TOKEN": "canary-123",
                                                     "SIM_HOST_NAME": "forged"})
        assert out.read().decode().split() == ["canary-123", "gpu-2"]
        chan = client.get_transport().open_session()
        chan.exec_command("echo $$; sleep 60")
        pid = int(chan.makefile().readline())
        assert pid in marked_pids(shared_sim.simdir)
        chan.close()
        deadline = time.monotonic() + 5
        while pid in marked_pids(shared_sim.simdir):
            assert time.monotonic() < deadline, "process survived its channel"
            time.sleep(0.05)
    finally:
        client.close()


def test_sftp_and_pty(shared_sim):
    client = _client(shared_sim, "gpu-1")
    try:
        sftp = client.open_sftp()
        with sftp.open("hello.txt", "w") as f:
            f.write("hi there")
        assert sftp.stat("hello.txt").st_size == 8
        home = shared_sim.host("gpu-1")["root"] + "/root"
        assert open(f"{home}/hello.txt").read() == "hi there"
        sftp.remove("hello.txt")
        sftp.close()
        _, out, _ = client.exec_command("tty -s && echo tty || echo notty", get_pty=True)
        assert out.read().decode().strip() == "tty"
    finally:
        client.close()


def test_every_host_has_its_own_port_30000(shared_sim):
    servers = []
    try:
        for name in ("gpu-1", "gpu-2"):
            h = shared_sim.host(name)
            s = socket.socket()
            # as servers bind (SO_REUSEADDR): an earlier simulator's port may linger in TIME_WAIT
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((h["address"], 30000))  # both bind: distinct loopback addresses
            servers.append(s)
    finally:
        for s in servers:
            s.close()


@pytest.mark.parametrize("host", ["pve-1"])
def test_hypervisor_files(shared_sim, host):
    code = "print(open('/etc/pve/lxc/101.conf').read())"
    conf = ssh_ok(shared_sim, host, f"python3 -c {shlex.quote(code)}")
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in conf
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in conf
    assert ssh_ok(shared_sim, host, "pct status 101").strip() == "status: running"
    assert "lxc.cgroup2.devices.allow" in ssh_ok(shared_sim, host, "pct config 101")
    assert shared_sim.ssh(host, "pct status 999").returncode == 255
