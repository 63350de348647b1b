"""The GPU probes of orchestrator/remote/gpu.py against recorded outputs (tests/remote/data):
nvidia-smi csv, /proc/devices, cgroup v1 devices.list, kern.log. No GPU host needed."""

from __future__ import annotations

import ast
import stat
import sys
from pathlib import Path

from orchestrator.remote import gpu

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------- /proc/devices


def test_proc_devices_gives_the_uvm_major_and_every_char_device() -> None:
    text = read("proc-devices-pve.txt")
    parsed = gpu.parse_proc_devices(text)
    assert parsed["char"][195] == "nvidia-frontend"
    assert parsed["char"][511] == "nvidia-uvm"
    assert parsed["char"][4] == "/dev/vc/0"  # first name of a shared major wins
    assert parsed["block"][8] == "sd" and 511 not in parsed["block"]
    assert gpu.uvm_major_from_proc_devices(text) == 511
    assert gpu.uvm_major_from_proc_devices(read("proc-devices-no-uvm.txt")) is None
    # a block device named like the module must not count
    assert gpu.uvm_major_from_proc_devices("Block devices:\n 12 nvidia-uvm\n") is None


# --------------------------------------------------------------------------- devices.list


def test_devices_list_v1_allow_rules() -> None:
    ok = gpu.parse_devices_list(read("devices-list-v1-ok.txt"))
    assert {"type": "c", "major": 195, "minor": "*", "access": "rwm"} in ok
    assert gpu.devices_allow(ok, 511, 0) and gpu.devices_allow(ok, 195, 255)
    stale = gpu.parse_devices_list(read("devices-list-v1-no-uvm.txt"))
    assert not gpu.devices_allow(stale, 511, 0)  # the rule names the old major 509
    assert gpu.devices_allow(stale, 509, 0)
    # "c *:* m" grants mknod only, not read/write
    assert not gpu.devices_allow(gpu.parse_devices_list("c *:* m\n"), 511, 0)
    host = gpu.parse_devices_list(read("devices-list-host.txt"))
    assert gpu.devices_allow(host, 511, 0)
    minor_only = gpu.parse_devices_list("c 511:1 rwm\n")
    assert not gpu.devices_allow(minor_only, 511, 0) and gpu.devices_allow(minor_only, 511, 1)


# --------------------------------------------------------------------------- nvidia-smi


def test_smi_gpu_rows() -> None:
    devs = gpu.smi_gpu_rows(read("smi-query-gpu-rtx-pro-6000x8.csv"))
    assert len(devs) == 8
    d0 = devs[0]
    assert d0 == {
        "index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "uuid": "GPU-0f5a5c1e-8c1b-4f6e-9a44-3d8e1b2c7a01", "pci_bus_id": "00000000:18:00.0",
        "memory_total_mib": 97887, "memory_used_mib": 0, "compute_capability": "12.0",
        "ecc_uncorrected": 0, "persistence_mode": True, "pcie_gen": 5, "pcie_width": 16,
        "driver_version": "580.95.05",
    }
    assert devs[4]["memory_used_mib"] == 88214
    assert devs[5]["ecc_uncorrected"] == 2 and devs[5]["pcie_gen"] == 4
    assert devs[6]["persistence_mode"] is False and devs[6]["pcie_width"] == 8


def test_smi_not_available_values_become_none() -> None:
    h200, geforce = gpu.smi_gpu_rows(read("smi-query-gpu-na.csv"))
    assert h200["name"] == "NVIDIA H200" and h200["memory_total_mib"] == 143771
    assert h200["ecc_uncorrected"] is None and h200["pcie_gen"] is None
    assert h200["compute_capability"] == "9.0"
    assert geforce["compute_capability"] is None and geforce["persistence_mode"] is False


def test_smi_apps_keep_commas_in_names_and_na_sizes() -> None:
    apps = gpu.smi_app_rows(read("smi-query-apps.csv"))
    assert [a["pid"] for a in apps] == [48213, 48213, 50977]
    assert apps[0]["used_mib"] == 90112
    assert apps[0]["name"] == "/opt/orchestrator/venvs/sglang/bin/python3"
    assert apps[2]["used_mib"] is None
    assert apps[2]["name"] == "/usr/bin/python3 -m my_app, worker 2"


def test_smi_banner_bad_field_and_cuda_ints() -> None:
    assert gpu.smi_cuda_version(read("smi-banner.txt")) == "13.0"
    assert gpu.smi_cuda_version("no banner") is None
    assert gpu.smi_bad_field(read("smi-bad-field.txt")) == "compute_cap"
    assert gpu.cuda_version_str(12080) == "12.8"
    assert gpu.cuda_version_str(13000) == "13.0"
    assert gpu.cuda_version_str(None) is None and gpu.cuda_version_str(0) is None


FAKE_SMI = r'''#!{python}
"""An nvidia-smi stand-in that answers from recorded files, like an older driver that
does not know the compute_cap field."""
import sys
data = {data!r}
args = sys.argv[1:]
if not args:
    sys.stdout.write(open(data + "/smi-banner.txt").read()); sys.exit(0)
q = args[0]
if q.startswith("--query-gpu="):
    if "compute_cap" in q:
        sys.stdout.write(open(data + "/smi-bad-field.txt").read()); sys.exit(2)
    fields = q.split("=", 1)[1].split(",")
    rows = [line.split(", ") for line in open(data + "/smi-query-gpu-rtx-pro-6000x8.csv")]
    full = {gpu_fields!r}
    for r in rows:
        sys.stdout.write(", ".join(r[full.index(f)].strip() for f in fields) + "\n")
    sys.exit(0)
if q.startswith("--query-compute-apps="):
    sys.stdout.write(open(data + "/smi-query-apps.csv").read()); sys.exit(0)
sys.exit(2)
'''


def test_gpu_facts_through_nvidia_smi_drops_unknown_fields(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, data=str(DATA),
                                   gpu_fields=list(gpu.SMI_GPU_FIELDS)))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    facts = gpu.gpu_facts(nvml=False, smi=str(smi))
    assert facts["source"] == "nvidia-smi" and facts["error"] is None
    assert facts["count"] == 8 and facts["driver_version"] == "580.95.05"
    assert facts["cuda_driver_version"] == "13.0"
    assert all(d["compute_capability"] is None for d in facts["devices"])  # field dropped
    assert facts["devices"][7]["memory_total_mib"] == 97887
    by_pid = {(p["pid"], p["gpu_index"]) for p in facts["processes"]}
    assert by_pid == {(48213, 0), (48213, 1), (50977, 4)}


def test_gpu_facts_without_any_gpu_tool_says_so(tmp_path: Path) -> None:
    facts = gpu.gpu_facts(nvml=False, smi=str(tmp_path / "no-such-nvidia-smi"))
    assert facts["source"] is None and facts["count"] == 0
    assert "no GPU tool on this host" in facts["error"]
    assert "nvidia-smi" in facts["error"]


# --------------------------------------------------------------------------- kern.log


def test_xid_lines_with_codes() -> None:
    events = gpu.parse_xid_lines(read("kern-log-xid.txt"))
    assert [e["code"] for e in events] == [13, 31, 79]
    lost = events[-1]
    assert lost["pci"] == "0000:db:00"
    assert lost["detail"].endswith("GPU has fallen off the bus.")
    assert lost["line"].startswith("Nov 29 03:02:11 pve kernel:")


def test_kernel_xid_probe_reads_the_log_and_limits(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(read("kern-log-xid.txt"))
    res = gpu.kernel_xid(kern_log=str(log), dmesg=False, limit=2)
    assert [e["code"] for e in res["events"]] == [31, 79]
    assert res["codes"] == [31, 79] and res["sources"] == {"kern.log": "read"}
    res = gpu.kernel_xid(kern_log=str(tmp_path / "absent.log"), dmesg=False)
    assert res["events"] == [] and res["sources"]["kern.log"] == "absent"


# --------------------------------------------------------------------------- uvm_facts


def test_uvm_facts_from_recorded_files(tmp_path: Path) -> None:
    """/dev/null stands in for a stale uvm node: a char device whose major (1) is not the
    kernel's uvm major (511); devices.list v1 names the old major 509."""
    res = gpu.uvm_facts(cuda=False, uvm_path="/dev/null",
                        proc_devices=str(DATA / "proc-devices-pve.txt"),
                        devices_list=str(DATA / "devices-list-v1-no-uvm.txt"))
    assert res["proc_major"] == 511 and res["char_devices"]["195"] == "nvidia-frontend"
    assert res["node"]["present"] and res["node"]["major"] == 1
    assert res["major_match"] is False
    assert res["cgroup"]["version"] == 1
    assert res["cgroup"]["allows_uvm"] is True  # the node 1:3 is allowed by `c 1:3 rwm`
    assert res["open"]["ok"] is True and res["cuda_init"] is None
    only_nvidia = tmp_path / "devices.list"
    only_nvidia.write_text("c *:* m\nc 195:* rwm\n")
    denied = gpu.uvm_facts(cuda=False, uvm_path="/dev/null", devices_list=str(only_nvidia),
                           proc_devices=str(DATA / "proc-devices-pve.txt"))
    assert denied["cgroup"]["allows_uvm"] is False
    missing = gpu.uvm_facts(cuda=False, uvm_path=str(tmp_path / "nvidia-uvm"),
                            proc_devices=str(DATA / "proc-devices-no-uvm.txt"),
                            devices_list=str(tmp_path / "no-devices.list"),
                            cgroup_root=str(tmp_path))
    assert missing["proc_major"] is None and missing["node"]["present"] is False
    assert missing["open"]["errno"] == "ENOENT" and missing["major_match"] is None
    assert missing["cgroup"] == {"version": None, "devices_list": None, "rules": None,
                                 "allows_uvm": None}


def test_cuda_init_child_without_libcuda_is_unknown_not_an_error() -> None:
    res = gpu.cuda_init_child()
    # on this machine there is either a real libcuda (code is an int) or none (unknown)
    assert res["source"] in ("libcuda", "unknown")
    if res["source"] == "unknown":
        assert res["code"] is None and "libcuda.so.1" in res["error"]
    else:
        assert isinstance(res["code"], int) and res["name"]


# --------------------------------------------------------------------------- shm / disk


def test_shm_facts_and_dir_usage(tmp_path: Path) -> None:
    shm = gpu.shm_facts(str(tmp_path))
    assert shm["exists"] and shm["size"] >= shm["free"] > 0
    assert gpu.shm_facts(str(tmp_path / "none"))["exists"] is False
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.bin").write_bytes(b"x" * 100_000)
    (tmp_path / "m" / "link").symlink_to(tmp_path / "m" / "a.bin")
    use = gpu.dir_usage(str(tmp_path / "m"))
    assert use["files"] == 2 and 100_000 <= use["bytes"] < 200_000  # link not followed
    assert gpu.dir_usage(str(tmp_path / "absent")) == {
        "path": str(tmp_path / "absent"), "exists": False, "bytes": 0, "files": 0,
        "complete": True}


def test_probe_module_is_python38_and_stdlib_only() -> None:
    src = Path(gpu.__file__).read_text()
    ast.parse(src, feature_version=(3, 8))
    imported = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"__future__", "orchestrator", "pynvml"}
    assert imported <= allowed, imported - allowed
    assert {"gpu_facts", "uvm_facts", "shm_facts", "kernel_xid", "dir_usage"} <= set(
        gpu.probe.__globals__["PROBES"])
