"""host_health's rules from tables, no host (pyinfra's tests/operations/*.json style).

A row: params + facts -> the problems found (key; "+" when this stage repairs it) and texts
they say. Facts are the REAL answers recorded from the simulator (tests/facts/<probe>/<case>
.json, e.g. "uvm-cgroup"), optionally patched ("devices.2.compute_capability": "8.9";
"*" patches every element of a list).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.model import HypervisorSpec
from orchestrator.facts.hardware import (
    DirUsage,
    DiskFree,
    GpuHealth,
    KernelXid,
    ShmFacts,
    UvmFacts,
)
from orchestrator.stages.host_health_rules import (
    DiskBudget,
    HealthFacts,
    HostHealthParams,
    HypervisorView,
    failure_text,
    plan_uvm_allow,
    problems,
    repair,
    repair_reason,
    summary,
    uvm_symptoms,
    verify_failure,
    version_less,
)

FACTS = Path(__file__).resolve().parents[1] / "facts"
PARAMS: dict[str, Any] = {
    "gpus": 8, "min_gpu_memory_gib": 90, "min_driver": "570.26", "compute_capability": "12.0",
    "require_cuda": True, "min_shm_gib": 16, "disk_path": "/opt/orchestrator/models",
    "disk_needed_gib": 1,
}
HV = HypervisorSpec(host="pve-1", ctid=101)
GPU = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def answer(probe: str, case: str) -> Any:
    """A recorded answer (deep copy: rows patch it)."""
    return copy.deepcopy(json.loads((FACTS / probe / f"{case}.json").read_text())["answer"])


def patch(data: Any, path: str, value: Any) -> None:
    """Set `value` at a dotted path ("devices.2.name"; "*" = every element)."""
    head, _, rest = path.partition(".")
    if head == "*":
        for item in data:
            patch(item, rest, value)
        return
    key: Any = int(head) if isinstance(data, list) else head
    if rest:
        patch(data[key], rest, value)
    else:
        data[key] = value


def host_facts(cases: dict[str, str] | None = None, patches: dict[str, dict[str, Any]] | None
               = None, needed_gib: float | None = 1) -> HealthFacts:
    """HealthFacts from recorded answers ("healthy" unless `cases` names another)."""
    cases, patches = cases or {}, patches or {}
    answers = {probe: answer(probe, cases.get(probe, "healthy")) for probe in
               ("gpu_facts", "uvm_facts", "shm_facts", "kernel_xid", "disk_free", "dir_usage")}
    for probe, changes in patches.items():
        for path, value in changes.items():
            patch(answers[probe], path, value)
    disk = DiskBudget.of(DiskFree.from_answer(answers["disk_free"]),
                         DirUsage.from_answer(answers["dir_usage"]), needed_gib)
    return HealthFacts(GpuHealth.from_answer(answers["gpu_facts"]),
                       UvmFacts.from_answer(answers["uvm_facts"]),
                       ShmFacts.from_answer(answers["shm_facts"]),
                       KernelXid.from_answer(answers["kernel_xid"]), disk)


def row(id: str, found: list[str], *, params: dict[str, Any] | None = None,
        cases: dict[str, str] | None = None, patches: dict[str, dict[str, Any]] | None = None,
        hv: bool = True, can_fix: bool = True, says: tuple[str, ...] = (),
        never: tuple[str, ...] = ()) -> Any:
    """One table row (params are merged over PARAMS; None removes one)."""
    return pytest.param(dict(params or {}), cases, patches, hv, can_fix, found, says, never,
                        id=id)


TABLE = [
    # ---- healthy, and params that turn checks off
    row("healthy", []),
    row("healthy-defaults-only", [], params={k: None for k in PARAMS if k != "require_cuda"}),
    row("healthy-no-hypervisor", [], hv=False),
    row("healthy-local", [], can_fix=False),
    row("nvml-absent-smi-answers", [], cases={"gpu_facts": "nvml-absent"}),
    # ---- GPU listing
    row("gpu-missing-xid79", ["gpu-count"], cases={"gpu_facts": "gpu-missing",
                                                   "kernel_xid": "gpu-missing"},
        says=("found 7 GPUs, expected 8; kernel log: ", "GPU has fallen off the bus",
              "Xid 79: the GPU fell off the bus: power-cycle the host")),
    row("gpu-missing-no-xid", ["gpu-count"], cases={"gpu_facts": "gpu-missing"},
        says=("found 7 GPUs, expected 8", "check `nvidia-smi -L`",
              "mount entries of /etc/pve/lxc/101.conf"), never=("kernel log",)),
    row("gpu-missing-no-hypervisor", ["gpu-count"], cases={"gpu_facts": "gpu-missing"},
        hv=False, says=("/etc/pve/lxc/<CTID>.conf",)),
    row("gpu-missing-other-xid-only", ["gpu-count"], cases={"gpu_facts": "gpu-missing",
                                                            "kernel_xid": "gpu-missing"},
        patches={"kernel_xid": {"events.0.code": 13}}, never=("kernel log",)),
    row("gpu-missing-count-not-asked", [], cases={"gpu_facts": "gpu-missing"},
        params={"gpus": None}),
    row("gpu-missing-7-asked", [], cases={"gpu_facts": "gpu-missing"}, params={"gpus": 7}),
    row("more-gpus-than-asked", [], params={"gpus": 4}),
    row("driver-gone", ["gpu-tool", "uvm+", "cuda"], cases={"gpu_facts": "driver-gone",
                                                            "uvm_facts": "driver-gone"},
        says=("no GPU could be listed: NVML: nvmlInit: Driver Not Loaded; nvidia-smi: "
              "nvidia-smi exited 9", "install the NVIDIA driver (nvidia-smi, "
              "libnvidia-ml.so.1)", "the nvidia-uvm module is not loaded",
              "CUDA init returns 100 (CUDA_ERROR_NO_DEVICE)")),
    row("driver-gone-no-cuda-check", ["gpu-tool"], cases={"gpu_facts": "driver-gone",
                                                          "uvm_facts": "driver-gone"},
        params={"require_cuda": False}, says=("/etc/pve/lxc/101.conf)",)),
    # ---- memory, compute capability, ECC
    row("memory-below", ["gpu-memory"], params={"min_gpu_memory_gib": 96},
        says=(f"GPU memory below 96.0 GiB: GPU 0 ({GPU}) has 95.6 GiB, GPU 1 ",)),
    row("memory-just-enough", [], params={"min_gpu_memory_gib": 95.5}),
    row("memory-unknown-counts-as-0", ["gpu-memory"],
        patches={"gpu_facts": {"devices.3.memory_total_mib": None}},
        says=(f"GPU memory below 90.0 GiB: GPU 3 ({GPU}) has 0.0 GiB",)),
    row("memory-not-asked", [], params={"min_gpu_memory_gib": None},
        patches={"gpu_facts": {"devices.*.memory_total_mib": 1024}}),
    row("cc-all-differ", ["compute-capability"], params={"compute_capability": "9.0"},
        says=(f"compute capability differs from 9.0: GPU 0 ({GPU}) is 12.0, ",
              "sm_120 needs flashinfer or triton")),
    row("cc-one-differs", ["compute-capability"],
        patches={"gpu_facts": {"devices.2.compute_capability": "8.9"}},
        says=(f"compute capability differs from 12.0: GPU 2 ({GPU}) is 8.9\n",),
        never=("GPU 1 (",)),
    row("cc-unknown-passes", [], patches={"gpu_facts": {"devices.*.compute_capability": None}}),
    row("cc-not-asked", [], params={"compute_capability": None},
        patches={"gpu_facts": {"devices.*.compute_capability": "8.0"}}),
    row("ecc-one-gpu", ["ecc"], patches={"gpu_facts": {"devices.5.ecc_uncorrected": 2}},
        says=("uncorrected ECC errors above 0: GPU 5 has 2\n", "nvidia-smi -r -i N")),
    row("ecc-within-budget", [], params={"max_ecc_errors": 2},
        patches={"gpu_facts": {"devices.5.ecc_uncorrected": 2}}),
    row("ecc-not-supported", [], patches={"gpu_facts": {"devices.*.ecc_uncorrected": None}}),
    # ---- driver
    row("driver-old", ["driver", "cuda"], cases={"gpu_facts": "driver-old",
                                                 "uvm_facts": "driver-old"},
        says=("NVIDIA driver 550.54.15 is older than 570.26 (570.26 is the minimum for "
              "sm_120", "CUDA init returns 35 (CUDA_ERROR_INSUFFICIENT_DRIVER)")),
    row("driver-old-not-asked", ["cuda"], params={"min_driver": None},
        cases={"gpu_facts": "driver-old", "uvm_facts": "driver-old"}),
    row("driver-old-low-minimum", ["cuda"], params={"min_driver": "550"},
        cases={"gpu_facts": "driver-old", "uvm_facts": "driver-old"}),
    row("driver-equal", [], params={"min_driver": "580.95.05"}),
    row("driver-one-patch-newer-needed", ["driver"], params={"min_driver": "580.95.06"},
        says=("install driver >= 580.95.06 on the hypervisor",)),
    row("driver-major-newer-needed", ["driver"], params={"min_driver": "581"}),
    row("driver-unknown-passes", [], patches={"gpu_facts": {"driver_version": None}}),
    # ---- busy GPUs
    row("busy", ["busy"], cases={"gpu_facts": "stale-server"},
        says=("holds 400000 MiB on GPU 0-7", "these are HOST pids", "or set allow_busy_gpus")),
    row("busy-allowed", [], cases={"gpu_facts": "stale-server"},
        params={"allow_busy_gpus": True}),
    row("busy-allowed-cuda-proven-not-run", [], cases={"gpu_facts": "stale-server"},
        params={"allow_busy_gpus": True}, patches={"uvm_facts": {"cuda_init": None}}),
    row("idle-gpus-cuda-not-run", ["cuda"], patches={"uvm_facts": {"cuda_init": None}},
        says=("CUDA init could not be tested",)),
    row("busy-two-pids-ranges", ["busy"], patches={"gpu_facts": {"processes": [
        {"pid": 7, "gpu_index": 0, "used_mib": 10, "name": "a"},
        {"pid": 7, "gpu_index": 1, "used_mib": 10, "name": "a"},
        {"pid": 7, "gpu_index": 3, "used_mib": 5, "name": "a"},
        {"pid": 3, "gpu_index": 6, "used_mib": None, "name": None}]}},
        says=("GPU memory is in use: PID 3 (?) holds 0 MiB on GPU 6; PID 7 (a) holds 25 MiB "
              "on GPU 0-1,3", "`kill 3 7` (then `kill -9 3 7`")),
    row("busy-row-without-pid-ignored", [],
        patches={"gpu_facts": {"processes": [{"pid": None, "gpu_index": 0}]}}),
    # ---- nvidia-uvm and CUDA init
    row("uvm-cgroup-repairable", ["uvm+"], cases={"uvm_facts": "uvm-cgroup"},
        says=("nvidia-uvm is unusable here: open('/dev/nvidia-uvm', O_RDWR) is refused "
              "(EPERM): the device cgroup does not allow major 235; CUDA init returns 999 "
              "(CUDA_ERROR_UNKNOWN)", "done by this stage (fix_uvm)")),
    row("uvm-cgroup-no-hypervisor", ["uvm"], cases={"uvm_facts": "uvm-cgroup"}, hv=False,
        says=("`lxc.cgroup2.devices.allow: c 235:* rwm`", "/etc/pve/lxc/<CTID>.conf",
              "give this host `hypervisor: {host: <inventory name>, ctid: <id>}`")),
    row("uvm-cgroup-fix-off", ["uvm"], cases={"uvm_facts": "uvm-cgroup"},
        params={"fix_uvm": False}, says=("on pve-1: run `nvidia-modprobe -u -c=0`",
                                         "(or set fix_uvm: true to have it done for you)")),
    row("uvm-cgroup-local-run", ["uvm"], cases={"uvm_facts": "uvm-cgroup"}, can_fix=False),
    row("uvm-cgroup-cuda-not-required", [], cases={"uvm_facts": "uvm-cgroup"},
        params={"require_cuda": False}),
    row("uvm-node-missing", ["uvm+"], cases={"uvm_facts": "uvm-node-missing"},
        says=("the nvidia-uvm module is not loaded (no nvidia-uvm line in /proc/devices); "
              "/dev/nvidia-uvm does not exist here; CUDA init returns 999",
              "<MAJOR of nvidia-uvm in /proc/devices>"), never=("EPERM",)),
    row("uvm-stale-node-major", ["uvm+"], patches={"uvm_facts": {
        "node.major": 234, "major_match": False}},
        says=("/dev/nvidia-uvm has major 234 but the kernel's nvidia-uvm major is 235",)),
    row("uvm-open-eacces", ["uvm+"], patches={"uvm_facts": {
        "open": {"ok": False, "errno": "EACCES", "error": "Permission denied"}}},
        says=("open('/dev/nvidia-uvm', O_RDWR) fails: EACCES Permission denied",)),
    row("uvm-cgroup-v1-denies", ["uvm+"], patches={"uvm_facts": {"cgroup.allows_uvm": False}},
        says=("cgroup v1 devices.list does not allow c 235:0",)),
    row("uvm-cgroup-v1-denies-eperm-once", ["uvm+"], cases={"uvm_facts": "uvm-cgroup"},
        patches={"uvm_facts": {"cgroup.allows_uvm": False}}, never=("devices.list",)),
    row("uvm-and-shm-fail-together", ["uvm+", "shm"], cases={"uvm_facts": "uvm-cgroup",
                                                             "shm_facts": "shm-small"}),
    row("cuda-untestable", ["cuda"], patches={"uvm_facts": {"cuda_init": None}},
        says=("CUDA init could not be tested: no libcuda", "or set require_cuda: false")),
    row("cuda-libcuda-missing", ["cuda"], patches={"uvm_facts": {"cuda_init": {
        "code": None, "source": "unknown", "error": "libcuda.so.1 not loadable: x"}}},
        says=("CUDA init could not be tested: libcuda.so.1 not loadable: x",)),
    row("cuda-803", ["cuda"], patches={"uvm_facts": {"cuda_init.code": 803,
                                                     "cuda_init.name": "X"}},
        says=("CUDA init returns 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)",)),
    row("cuda-999-uvm-fine", ["cuda"], patches={"uvm_facts": {
        "cuda_init.code": 999, "cuda_init.name": "CUDA_ERROR_UNKNOWN"}},
        says=("CUDA init returns 999 (CUDA_ERROR_UNKNOWN) although /dev/nvidia-uvm opens "
              "fine",)),
    row("cuda-100", ["cuda"], patches={"uvm_facts": {
        "cuda_init.code": 100, "cuda_init.name": "CUDA_ERROR_NO_DEVICE"}},
        says=("CUDA init returns 100 (CUDA_ERROR_NO_DEVICE)", "dmesg | grep -i -e nvrm")),
    # ---- /dev/shm
    row("shm-small", ["shm"], cases={"shm_facts": "shm-small"},
        says=("/dev/shm is 64 MiB, need >= 16 GiB (NCCL crashes in ncclShmOpen",
              "size=16G,create=dir 0 0` to /etc/pve/lxc/101.conf", "--shm-size=16g")),
    row("shm-not-asked", [], cases={"shm_facts": "shm-small"}, params={"min_shm_gib": None}),
    row("shm-missing", ["shm"], patches={"shm_facts": {"size": None}},
        says=("/dev/shm is missing, need >= 16 GiB",)),
    row("shm-8g", ["shm"], patches={"shm_facts": {"size": 8 * 1024**3}},
        says=("/dev/shm is 8.0 GiB, need >= 16 GiB",)),
    row("shm-half-gib-rounds-up", ["shm"], cases={"shm_facts": "shm-small"},
        params={"min_shm_gib": 0.5}, says=("need >= 0.5 GiB", "size=1G", "--shm-size=1g")),
    row("shm-fraction-rounds-up", ["shm"], params={"min_shm_gib": 200.5},
        says=("/dev/shm is 128.0 GiB, need >= 200.5 GiB", "remount,size=201G")),
    # ---- disk
    row("disk-full", ["disk"], cases={"disk_free": "disk-full"},
        params={"disk_needed_gib": 600},
        says=("needs 600.0 GiB in total: 0.0 GiB already there, only 0.1 GiB free on the "
              "filesystem of ", "(short by 599.9 GiB)", "point disk_path (models_dir)")),
    row("disk-full-not-asked", [], cases={"disk_free": "disk-full"},
        params={"disk_needed_gib": None}),
    row("disk-present-counts", [], cases={"disk_free": "disk-full"},
        params={"disk_needed_gib": 600}, patches={"dir_usage": {"bytes": 600 * 1024**3}}),
    row("disk-too-big-for-healthy", ["disk"], params={"disk_needed_gib": 10_000}),
    # ---- everything at once, in the order the error lists it
    row("all-wrong", ["driver", "ecc", "busy", "cuda", "shm", "disk"],
        cases={"gpu_facts": "driver-old", "uvm_facts": "driver-old",
               "shm_facts": "shm-small", "disk_free": "disk-full"},
        patches={"gpu_facts": {"devices.0.ecc_uncorrected": 1, "processes": [
            {"pid": 9, "gpu_index": 0, "used_mib": 1, "name": "x"}]}},
        params={"disk_needed_gib": 600}),
]


@pytest.mark.parametrize(
    ("params", "cases", "patches", "hv", "can_fix", "found", "says", "never"), TABLE)
def test_problems_table(params: dict[str, Any], cases: dict[str, str] | None,
                        patches: dict[str, dict[str, Any]] | None, hv: bool, can_fix: bool,
                        found: list[str], says: tuple[str, ...], never: tuple[str, ...]) -> None:
    merged = {k: v for k, v in dict(PARAMS, **params).items() if v is not None}
    p = HostHealthParams.model_validate(merged)
    facts = host_facts(cases, patches, needed_gib=p.disk_needed_gib)
    got = problems(p, facts, HV if hv else None, can_fix=can_fix)
    assert [pr.key + ("+" if pr.remediable else "") for pr in got] == found
    text = "\n".join(pr.render() for pr in got)
    for s in says:
        assert s in text, (s, text)
    for s in never:
        assert s not in text, (s, text)
    fix = repair(got)
    assert (fix is not None) == (bool(got) and all(f.endswith("+") for f in found))


# --------------------------------------------------------------------------- the verdict texts


def test_failure_text_counts_and_renders_each_problem() -> None:
    p = HostHealthParams.model_validate(PARAMS)
    got = problems(p, host_facts({"shm_facts": "shm-small"}), HV)
    assert failure_text("gpu-1", got).startswith(
        "host gpu-1 is not fit to serve (1 problem):\n- /dev/shm is 64 MiB")
    assert "\n    fix: LXC: add `lxc.mount.entry" in failure_text("gpu-1", got)
    assert "(2 problems)" in failure_text("gpu-1", got + got)


SUMMARY = [
    ({}, None, f"8 x {GPU} (95.6 GiB), driver 580.95.05 / CUDA 13.0 (via nvml), CUDA init 0 "
               "(uvm major 235), /dev/shm 128.0 GiB, "),
    ({"gpu_facts": "nvml-absent"}, None, "(via nvidia-smi)"),
    ({"gpu_facts": "driver-gone", "uvm_facts": "driver-gone"}, None,
     "0 x GPU (0.0 GiB), driver None / CUDA None (via None), CUDA init 100 (uvm major None)"),
    ({"uvm_facts": "hypervisor-no-cuda"}, None,
     "(via nvml), /dev/nvidia-uvm opens (major 235), /dev/shm 128.0 GiB"),
    ({}, {"shm_facts": {"size": None}}, "(uvm major 235), 3815.7 GiB free at "),
]


@pytest.mark.parametrize(("cases", "patches", "expect"), SUMMARY)
def test_summary_table(cases: dict[str, str], patches: dict[str, Any] | None,
                       expect: str) -> None:
    assert expect in summary(host_facts(cases, patches))


def test_summary_without_disk_ends_with_shm() -> None:
    f = host_facts()
    f = HealthFacts(f.gpus, f.uvm, f.shm, f.xid, None)
    assert summary(f).endswith("/dev/shm 128.0 GiB")


# --------------------------------------------------------------------------- repair plan texts

CONF = "arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
STALE = CONF + "lxc.cgroup2.devices.allow: c 509:* rwm\n"
REASONS = [
    (HypervisorView.of("/etc/pve/lxc/101.conf", CONF, UvmFacts.from_answer(
        answer("uvm_facts", "hypervisor-no-cuda"))),
     "add 'lxc.cgroup2.devices.allow: c 235:* rwm' as line 3 of /etc/pve/lxc/101.conf "
     "(backup next to it); restart the container: pct stop 101 && pct start 101"),
    (HypervisorView.of("/etc/pve/lxc/101.conf", STALE, UvmFacts.from_answer(
        answer("uvm_facts", "hypervisor-no-cuda"))),
     "line 3 of /etc/pve/lxc/101.conf: 'lxc.cgroup2.devices.allow: c 509:* rwm' -> "
     "'lxc.cgroup2.devices.allow: c 235:* rwm' (backup next to it)"),
    (HypervisorView.of("/etc/pve/lxc/101.conf", STALE.replace("509", "235"),
                       UvmFacts.from_answer(answer("uvm_facts", "hypervisor-no-cuda"))),
     "/etc/pve/lxc/101.conf already allows c 235:* (no edit); restart"),
    (HypervisorView.of("/etc/pve/lxc/101.conf", CONF, UvmFacts.from_answer(
        answer("uvm_facts", "uvm-node-missing"))),
     "then set `lxc.cgroup2.devices.allow: c <major it gets>:* rwm` in /etc/pve/lxc/101.conf "
     "(the nvidia-uvm module is not loaded there yet)"),
    (None, "set `lxc.cgroup2.devices.allow: c <current major>:* rwm` in /etc/pve/lxc/101.conf "
           "(hypervisor not readable now: boom)"),
]


@pytest.mark.parametrize(("view", "expect"), REASONS)
def test_repair_reason_table(view: HypervisorView | None, expect: str) -> None:
    reason = repair_reason("nvidia-uvm is unusable here: X", HV, view, "boom")
    assert reason.startswith("nvidia-uvm is unusable here: X. Repair plan (through hypervisor "
                             "pve-1): run `nvidia-modprobe -u -c=0` on pve-1; ")
    assert expect in reason and reason.endswith("pct stop 101 && pct start 101")


VERIFY: list[tuple[str, dict[str, Any], bool, str | None]] = [
    ("healthy", {}, True, None),
    ("uvm-cgroup", {}, True, "after the repair CUDA init returns 999 (CUDA_ERROR_UNKNOWN); "
                             "open('/dev/nvidia-uvm', O_RDWR) is refused (EPERM)"),
    ("uvm-node-missing", {}, True, "does not exist here"),
    ("healthy", {"cuda_init.code": 3, "cuda_init.name": None, "cuda_init.error": "e"}, False,
     "after the repair CUDA init returns 3 (e); no uvm symptom left"),
]


@pytest.mark.parametrize(("case", "changes", "hv", "expect"), VERIFY)
def test_verify_table(case: str, changes: dict[str, Any], hv: bool, expect: str | None) -> None:
    a = answer("uvm_facts", case)
    for path, value in changes.items():
        patch(a, path, value)
    bad = verify_failure(UvmFacts.from_answer(a), HV if hv else None)
    if expect is None:
        assert bad is None
        return
    assert bad is not None and expect in bad[0]
    if case == "uvm-node-missing":
        assert bad[1].startswith("the container has no /dev/nvidia-uvm: add `lxc.mount.entry: "
                                 "/dev/nvidia-uvm dev/nvidia-uvm") and "101.conf" in bad[1]
    if not hv:
        assert "/etc/pve/lxc/<CTID>.conf" in bad[1]


# --------------------------------------------------------------------------- small pure rules

SYMPTOMS = [
    ("healthy", 0), ("uvm-cgroup", 1), ("uvm-node-missing", 2), ("driver-gone", 1),
    ("driver-old", 0), ("hypervisor-no-cuda", 0),
]


@pytest.mark.parametrize(("case", "n"), SYMPTOMS)
def test_uvm_symptoms_of_recorded_answers(case: str, n: int) -> None:
    assert len(uvm_symptoms(UvmFacts.from_answer(answer("uvm_facts", case)))) == n


VERSIONS = [
    ("550.54.15", "570.26", True), ("580.95.05", "570.26", False), ("570.26", "570.26.00", False),
    ("570.25.99", "570.26", True), ("570", "570.26", True), ("575.x", "570.26", False),
    ("", "570.26", True), ("1000.0", "999.99", False),
]


@pytest.mark.parametrize(("a", "b", "less"), VERSIONS)
def test_version_less_table(a: str, b: str, less: bool) -> None:
    assert version_less(a, b) is less


EDITS = [
    # (conf, major, registered, action, changed lines)
    ("lxc.cgroup2.devices.allow: c 195:* rwm\n", 511, {}, "added", [2]),
    ("lxc.cgroup2.devices.allow: c 511:* rwm\n", 511, {}, "present", []),
    ("lxc.cgroup2.devices.allow: c 511:0 rw\n", 511, {}, "present", []),
    ("lxc.cgroup2.devices.allow: c 511:1 rw\n", 511, {511: "nvidia-uvm"}, "added", [2]),
    ("lxc.cgroup2.devices.allow: a *:* rwm\n", 511, {}, "present", []),
    ("lxc.cgroup2.devices.allow: c *:* rwm\n", 511, {}, "present", []),
    ("# lxc.cgroup2.devices.allow: c 511:* rwm\n", 511, {}, "added", [2]),
    ("dev0: /dev/nvidia-uvm\n", 511, {}, "passthrough", []),
    ("dev3: /dev/nvidia-uvm-tools\n", 511, {}, "added", [2]),
    ("lxc.cgroup2.devices.allow: c 238:* rwm\nlxc.cgroup2.devices.allow: c 700:* rwm\n", 511,
     {}, "replaced", [1]),
    ("lxc.cgroup2.devices.allow: c 700:* rwm\nlxc.cgroup2.devices.allow: c 238:* rwm\n", 511,
     {238: "nvidia-caps"}, "replaced", [1]),
    ("lxc.cgroup2.devices.allow: c 195:* rwm\n[snap]\nlxc.cgroup2.devices.allow: c 509:* rwm\n",
     511, {}, "added", [2]),
    ("", 511, {}, "added", [1]),
]


@pytest.mark.parametrize(("conf", "major", "registered", "action", "lines"), EDITS)
def test_plan_uvm_allow_table(conf: str, major: int, registered: dict[int, str], action: str,
                              lines: list[int]) -> None:
    edit = plan_uvm_allow(conf, major, registered)
    assert edit.action == action
    assert [c[0] for c in edit.changes] == lines
    assert (edit.text == conf) is (not lines)
    if lines:
        assert f"c {major}:" in edit.text.splitlines()[lines[0] - 1]


CUDA_INIT = [
    # (id, params, uvm case, gpu case, gpu patches, needed)
    ("idle-gpus-run-it", {}, "healthy", "healthy", {}, True),
    ("every-gpu-busy-skips-it", {}, "healthy", "stale-server", {}, False),
    ("one-gpu-idle-runs-it", {}, "healthy", "stale-server",
     {"processes": [{"pid": 7, "gpu_index": i, "used_mib": 1, "name": "a"} for i in range(7)]},
     True),
    ("busy-but-cgroup-refuses-runs-it", {}, "uvm-cgroup", "stale-server", {}, True),
    ("busy-but-node-missing-runs-it", {}, "uvm-node-missing", "stale-server", {}, True),
    ("no-gpus-listed-runs-it", {}, "healthy", "healthy", {"devices": []}, True),
    ("not-required", {"require_cuda": False}, "uvm-cgroup", "healthy", {}, False),
]


@pytest.mark.parametrize(("params", "uvm_case", "gpu_case", "gpu_patches", "needed"),
                         [pytest.param(*r[1:], id=r[0]) for r in CUDA_INIT])
def test_cuda_init_runs_unless_every_gpu_already_runs_cuda(
        params: dict[str, Any], uvm_case: str, gpu_case: str, gpu_patches: dict[str, Any],
        needed: bool) -> None:
    from orchestrator.stages.host_health_rules import cuda_init_needed

    gpus = answer("gpu_facts", gpu_case)
    for path, value in gpu_patches.items():
        patch(gpus, path, value)
    p = HostHealthParams.model_validate({**PARAMS, **params})
    assert cuda_init_needed(p, GpuHealth.from_answer(gpus),
                            UvmFacts.from_answer(answer("uvm_facts", uvm_case))) is needed
