"""host_health's rules: pure functions of typed facts (orchestrator.facts.hardware) and params.

    problems(params, facts, hv, can_fix) -> [Problem]    what is wrong, and what to do
    plan_uvm_allow(conf, major, registered) -> UvmEdit   the container conf edit for uvm
    repair_reason(...), verify_failure(...), summary(...) the texts check/verify answer with

No host is touched here; tests/stages/test_host_health_rules.py drives them from tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator, model_validator

from orchestrator.config.model import Duration, HypervisorSpec
from orchestrator.facts.hardware import (
    DirUsage,
    DiskFree,
    GpuBoard,
    GpuHealth,
    GpuUser,
    KernelXid,
    ShmFacts,
    UvmFacts,
)
from orchestrator.stages.base import Params

GIB = 1024**3
MIB = 1024**2
NVIDIA_MAJOR = 195
#: uvm majors seen in the field (FACTS.md): preferred when guessing which allow line is stale
KNOWN_UVM_MAJORS = frozenset(range(507, 512)) | frozenset(range(234, 244))
MODPROBE = "nvidia-modprobe -u -c=0"

_VERSION = re.compile(r"^\d+(\.\d+)*$")
_CC = re.compile(r"^\d+\.\d+$")
_ALLOW = re.compile(
    r"^(?P<key>\s*lxc\.cgroup2?\.devices\.allow\s*[:=]\s*)(?P<type>[abc])\s+"
    r"(?P<major>\d+|\*):(?P<minor>\d+|\*)(?P<rest>.*)$"
)
_DEV_UVM = re.compile(r"^\s*dev\d+\s*:\s*/dev/nvidia-uvm(?:[\s,]|$)")
_SECTION = re.compile(r"^\s*\[[^\]]+\]\s*$")


class HostHealthParams(Params):
    """Parameters of the host_health kind (every check is skipped when its param is unset)."""

    gpus: int | None = Field(None, ge=1, description="GPUs expected: at least this many")
    min_gpu_memory_gib: float | None = Field(
        None, gt=0, description="memory every GPU must have, in GiB")
    min_driver: str | None = Field(
        None, description='minimum NVIDIA driver version, e.g. "570.26" (the sm_120 minimum)')
    compute_capability: str | None = Field(
        None, description='compute capability every GPU must report, e.g. "12.0"')
    require_cuda: bool = Field(
        True, description="cuInit(0) must succeed (also checks /dev/nvidia-uvm and its cgroup)")
    min_shm_gib: float | None = Field(None, gt=0, description="minimum size of /dev/shm, GiB")
    disk_path: str | None = Field(None, description="where the models go (may not exist yet)")
    disk_needed_gib: float | None = Field(
        None, gt=0, description="GiB disk_path needs in total; bytes already in it count")
    max_ecc_errors: int = Field(
        0, ge=0, description="uncorrected volatile ECC errors allowed per GPU")
    allow_busy_gpus: bool = Field(
        False, description="processes holding GPU memory are reported but do not fail")
    fix_uvm: bool = Field(
        True, description="repair the nvidia-uvm cgroup rule through the host's hypervisor")
    restart_wait: Duration = Field(
        300.0, description="how long to wait for SSH after the container restart (30s, 5m)")

    @field_validator("min_driver", mode="before")
    @classmethod
    def _driver(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)  # written unquoted in YAML: 570.26
        if isinstance(v, str) and not _VERSION.match(v.strip()):
            raise ValueError(f'expected a driver version such as "570.26", got {v!r}')
        return v.strip() if isinstance(v, str) else v

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = f"{float(v):.1f}"
        if isinstance(v, str) and not _CC.match(v.strip()):
            raise ValueError(f'expected a compute capability such as "12.0", got {v!r}')
        return v.strip() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _disk(self) -> HostHealthParams:
        if self.disk_needed_gib is not None and not self.disk_path:
            raise ValueError("disk_needed_gib needs disk_path (the directory the models go to)")
        return self


# ------------------------------------------------------------------------------ the facts


@dataclass(frozen=True)
class DiskBudget:
    """disk_free of disk_path, with what is already there and what the models need in total."""

    path: str | None
    checked_path: str | None
    free: int
    total: int | None
    free_inodes: int | None
    present: int
    needed: int | None

    @classmethod
    def of(cls, free: DiskFree, usage: DirUsage, needed_gib: float | None) -> DiskBudget:
        """Combine the two probes' facts with the stage's disk_needed_gib."""
        return cls(path=free.path, checked_path=free.checked_path, free=free.free,
                   total=free.total, free_inodes=free.free_inodes, present=usage.bytes,
                   needed=int(needed_gib * GIB) if needed_gib else None)


@dataclass(frozen=True)
class HealthFacts:
    """Everything check() reads from the host (recorded as gpus, uvm, shm, xid, disk)."""

    gpus: GpuHealth
    uvm: UvmFacts
    shm: ShmFacts
    xid: KernelXid
    disk: DiskBudget | None = None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the host, and what to do about it."""

    key: str
    what: str
    fix: str
    remediable: bool = False

    def render(self) -> str:
        """The two lines the PreflightError shows for it."""
        return f"- {self.what}\n    fix: {self.fix}"


# ------------------------------------------------------------------------------ small helpers


def version_tuple(text: str | None) -> tuple[int, ...]:
    """ "580.95.05" -> (580, 95, 5); junk parts count as 0."""
    out = []
    for part in str(text or "").strip().split("."):
        digits = re.match(r"\d+", part)
        out.append(int(digits.group(0)) if digits else 0)
    return tuple(out)


def version_less(a: str, b: str) -> bool:
    """True when driver version `a` is older than `b` (missing parts are 0)."""
    ta, tb = version_tuple(a), version_tuple(b)
    n = max(len(ta), len(tb))
    return ta + (0,) * (n - len(ta)) < tb + (0,) * (n - len(tb))


def gib(n: float | int | None) -> str:
    """Bytes as "12.3 GiB" ("?" when unknown)."""
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def allow_line(major: int | str) -> str:
    """The Proxmox conf line that lets a container use the uvm device of `major`."""
    return f"lxc.cgroup2.devices.allow: c {major}:* rwm"


def ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if parts and parts[-1][1] == i - 1:
            parts[-1] = (parts[-1][0], i)
        else:
            parts.append((i, i))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def ctid_of(hv: HypervisorSpec | None) -> str:
    """The container id as messages show it."""
    return str(hv.ctid) if hv else "<CTID>"


# ------------------------------------------------------------------------------ the uvm conf edit


@dataclass(frozen=True)
class UvmEdit:
    """What to do to a container conf so its device cgroup allows the uvm `major`."""

    action: str  # "present" | "replaced" | "added" | "passthrough"
    major: int
    text: str  # the conf after the edit (== before for present/passthrough)
    changes: list[tuple[int, str, str]] = field(default_factory=list)  # (line, old, new)

    @property
    def changed(self) -> bool:
        """Whether the conf text changes."""
        return bool(self.changes)

    def describe(self, path: str) -> str:
        """The edit in words, line by line."""
        if self.action == "present":
            return f"{path} already allows c {self.major}:* (no edit)"
        if self.action == "passthrough":
            return f"{path} passes /dev/nvidia-uvm with a devN: entry (no edit)"
        parts = []
        for line, old, new in self.changes:
            if old:
                parts.append(f"line {line} of {path}: {old.strip()!r} -> {new.strip()!r}")
            else:
                parts.append(f"add {new.strip()!r} as line {line} of {path}")
        return "; ".join(parts)


def _allow_lines(lines: list[str], end: int) -> list[tuple[int, re.Match[str]]] | None:
    """The allow rules of the main section; None when a devN: entry passes uvm through."""
    allows: list[tuple[int, re.Match[str]]] = []
    for i in range(end):
        body = lines[i].rstrip("\r\n")
        if body.lstrip().startswith("#"):
            continue
        if _DEV_UVM.match(body):
            return None
        m = _ALLOW.match(body)
        if m:
            allows.append((i, m))
    return allows


def plan_uvm_allow(conf: str, major: int, registered: dict[int, str] | None = None) -> UvmEdit:
    """Edit a Proxmox container conf so its cgroup allows char major `major` (nvidia-uvm).

    Only the main section (before any `[snapshot]` header) is looked at. A line that already
    allows `c MAJOR:*` (or `:0`) leaves the conf as it is; so does a `devN: /dev/nvidia-uvm`
    entry (Proxmox allows the node's major at each start). Otherwise the stale uvm line - an
    allow line for a char major other than 195 that no driver registers now (`registered`:
    the hypervisor's /proc/devices char majors), preferring the majors uvm is known to get -
    has its major replaced (its minor and access kept, and so has a uvm-tools twin with the
    same old major); with no stale line, `lxc.cgroup2.devices.allow: c MAJOR:* rwm` is added
    after the last allow line (same key spelling as the 195 line). Nothing else changes.
    """
    registered = registered or {}
    lines = conf.splitlines(keepends=True)
    end = next((i for i, ln in enumerate(lines) if _SECTION.match(ln)), len(lines))
    allows = _allow_lines(lines, end)
    if allows is None:
        return UvmEdit("passthrough", major, conf)
    for _i, m in allows:
        if m["type"] == "a" or (m["type"] == "c" and m["major"] in ("*", str(major))
                                and m["minor"] in ("*", "0")):
            return UvmEdit("present", major, conf)
    stale = [(i, m) for i, m in allows
             if m["type"] == "c" and m["major"].isdigit()
             and int(m["major"]) != NVIDIA_MAJOR and int(m["major"]) not in registered]
    if stale:
        stale.sort(key=lambda im: (int(im[1]["major"]) not in KNOWN_UVM_MAJORS, im[0]))
        old_major = stale[0][1]["major"]
        changes = []
        for i, m in allows:
            if m["type"] == "c" and m["major"] == old_major:
                eol = lines[i][len(lines[i].rstrip("\r\n")):]
                new = f"{m['key']}c {major}:{m['minor']}{m['rest']}"
                changes.append((i + 1, lines[i].rstrip("\r\n"), new))
                lines[i] = new + eol
        return UvmEdit("replaced", major, "".join(lines), changes)
    key = next((m["key"] for _i, m in allows if m["major"] == str(NVIDIA_MAJOR)), None)
    new = f"{key or 'lxc.cgroup2.devices.allow: '}c {major}:* rwm"
    at = allows[-1][0] + 1 if allows else end
    if at > 0 and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    lines.insert(at, new + "\n")
    return UvmEdit("added", major, "".join(lines), [(at + 1, "", new)])


# ------------------------------------------------------------------------------ uvm and CUDA


def uvm_symptoms(uvm: UvmFacts) -> list[str]:
    """What is wrong with /dev/nvidia-uvm in these facts (empty when it is usable)."""
    out: list[str] = []
    proc, node, errno_name = uvm.proc_major, uvm.node, uvm.open.errno
    if proc is None:
        out.append("the nvidia-uvm module is not loaded (no nvidia-uvm line in /proc/devices)")
    if not node.present:
        out.append("/dev/nvidia-uvm does not exist here")
    elif uvm.major_match is False:
        out.append(f"/dev/nvidia-uvm has major {node.major} but the kernel's nvidia-uvm "
                   f"major is {proc} (a stale node from before a reboot or driver update)")
    if node.present and errno_name == "EPERM":
        out.append(f"open('/dev/nvidia-uvm', O_RDWR) is refused (EPERM): the device cgroup "
                   f"does not allow major {node.major}")
    elif node.present and errno_name and errno_name != "ENOENT":
        out.append(f"open('/dev/nvidia-uvm', O_RDWR) fails: {errno_name} {uvm.open.error}")
    if uvm.cgroup.allows_uvm is False and errno_name != "EPERM":
        out.append(f"cgroup v1 devices.list does not allow c {node.major or proc}:0")
    return out


def cuda_init_needed(p: HostHealthParams, gpus: GpuHealth, uvm: UvmFacts) -> bool:
    """Whether cuInit(0) must run in a new process to know that CUDA works here.

    Not when CUDA is already proven on this box: every GPU runs a compute process (each made a
    CUDA context, so cuInit works since this boot) and the agent's own look at nvidia-uvm shows
    nothing wrong (the kernel's major matches the node's and open(O_RDWR) passes the device
    cgroup: the exact step that fails with EPERM after a reboot moved the major). A converged
    host, whose server holds every GPU, then starts no interpreter for this check.
    """
    if not p.require_cuda:
        return False
    if uvm_symptoms(uvm) or not uvm.open.ok or not gpus.devices:
        return True
    busy = {u.gpu_index for u in gpus.processes}
    return not all(d.index in busy for d in gpus.devices)


def uvm_manual_fix(major: int | None, hv: HypervisorSpec | None,
                   automatic: bool = False) -> str:
    """How to repair the uvm rule by hand (and whether this stage does it)."""
    ctid = ctid_of(hv)
    where = hv.host if hv else "the Proxmox hypervisor"
    shown = major if major is not None else "<MAJOR of nvidia-uvm in /proc/devices>"
    text = (f"on {where}: run `{MODPROBE}`, then in /etc/pve/lxc/{ctid}.conf set the uvm "
            f"rule to the current major (replace the old `c <OLD>:* rwm` uvm line, keep "
            f"the 195 one): `{allow_line(shown)}`, then restart the container: "
            f"`pct stop {ctid} && pct start {ctid}`")
    if hv is None:
        text += ("; or give this host `hypervisor: {host: <inventory name>, ctid: <id>}` "
                 "in the inventory and keep fix_uvm: true to have it done for you. On a "
                 f"bare-metal host: run `{MODPROBE}` as root")
    elif automatic:
        text = ("done by this stage (fix_uvm) once the other problems are solved; by "
                "hand: " + text)
    else:
        text += " (or set fix_uvm: true to have it done for you)"
    return text


def _cuda_code_problem(code: int | None, name: str | None, error: str | None,
                       symptoms: bool) -> Problem | None:
    """The problem a cuInit(0) code is, by itself (None for 0, and for 999 with symptoms)."""
    if code is None:
        return Problem(
            "cuda", f"CUDA init could not be tested: {error or 'no libcuda'}",
            "install the user-space driver library libcuda.so.1 of the same version as the "
            "host's kernel module (e.g. the libcuda1 / libnvidia-compute package, or the "
            ".run installer with --no-kernel-module), or set require_cuda: false")
    if code == 35:
        return Problem(
            "cuda", "CUDA init returns 35 (CUDA_ERROR_INSUFFICIENT_DRIVER): the driver is "
            "too old for this CUDA / GPU", "install driver >= 570.26 (CUDA 12.8, the sm_120 "
            "minimum) on the hypervisor and the same version in the container")
    if code == 803:
        return Problem(
            "cuda", "CUDA init returns 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH): the "
            "container's libcuda differs from the host's kernel module version",
            "install exactly the hypervisor's driver version in the container "
            "(`--no-kernel-module`), compare `cat /proc/driver/nvidia/version` with "
            "`nvidia-smi`")
    if code not in (0, 999) or (code == 999 and not symptoms):
        return Problem(
            "cuda", f"CUDA init returns {code} ({name})"
            + (" although /dev/nvidia-uvm opens fine" if code == 999 else ""),
            "look at `dmesg | grep -i -e nvrm -e xid` on the hypervisor and `nvidia-smi` "
            f"here; `{MODPROBE}` on the hypervisor and a restart of the container often "
            "help")
    return None


def cuda_problems(p: HostHealthParams, uvm: UvmFacts, hv: HypervisorSpec | None,
                  can_fix: bool = True) -> list[Problem]:
    """nvidia-uvm (the one remediable problem) and what cuInit(0) returns."""
    out: list[Problem] = []
    cuda = uvm.cuda_init
    code, name = (cuda.code, cuda.name) if cuda else (None, None)
    symptoms = uvm_symptoms(uvm)
    if symptoms:
        what = "nvidia-uvm is unusable here: " + "; ".join(symptoms)
        if code not in (None, 0):
            what += f"; CUDA init returns {code} ({name})"
        fixable = p.fix_uvm and hv is not None and can_fix
        fix = uvm_manual_fix(uvm.proc_major, hv, automatic=fixable)
        out.append(Problem("uvm", what, fix, remediable=fixable))
    extra = _cuda_code_problem(code, name, cuda.error if cuda else None, bool(symptoms))
    return out + ([extra] if extra else [])


# ------------------------------------------------------------------------------ GPUs


def gpu_listing_problems(p: HostHealthParams, g: GpuHealth, xid: KernelXid,
                         ctid: str) -> list[Problem]:
    """No GPU tool at all, or fewer GPUs than expected (with the Xid 79 lines that explain)."""
    if g.source is None:
        return [Problem(
            "gpu-tool", f"no GPU could be listed: {g.error}",
            "install the NVIDIA driver (nvidia-smi, libnvidia-ml.so.1) matching the "
            "hypervisor's kernel module; in an LXC container pass the nodes through "
            "(`lxc.cgroup2.devices.allow: c 195:* rwm` and `lxc.mount.entry: /dev/nvidia0 "
            f"dev/nvidia0 none bind,optional,create=file` ... in /etc/pve/lxc/{ctid}.conf)")]
    if p.gpus is None or len(g.devices) >= p.gpus:
        return []
    lost = xid.lines_with(79)
    what = f"found {len(g.devices)} GPUs, expected {p.gpus}"
    if lost:
        what += "; kernel log: " + " | ".join(lost[-3:])
        fix = ("Xid 79: the GPU fell off the bus: power-cycle the host (a cold power "
               "cycle, not only a reboot); if it happens again, reseat or replace it")
    else:
        fix = ("check `nvidia-smi -L` and `dmesg | grep -i nvrm` on the hypervisor; "
               "a GPU that is not listed needs a power-cycle of the host; in an LXC "
               "container check the /dev/nvidiaN mount entries of "
               f"/etc/pve/lxc/{ctid}.conf")
    return [Problem("gpu-count", what, fix)]


def _each(devices: list[GpuBoard], text: str) -> str:
    return ", ".join(text.format(d=d) for d in devices)


def memory_problems(p: HostHealthParams, g: GpuHealth) -> list[Problem]:
    """GPUs with less memory than min_gpu_memory_gib."""
    if p.min_gpu_memory_gib is None:
        return []
    small = [d for d in g.devices if (d.memory_total_mib or 0) < p.min_gpu_memory_gib * 1024]
    if not small:
        return []
    return [Problem(
        "gpu-memory", f"GPU memory below {p.min_gpu_memory_gib} GiB: "
        + _each(small, "GPU {d.index} ({d.name}) has {d.memory_gib:.1f} GiB"),
        "use GPUs with enough memory, or lower min_gpu_memory_gib if the model fits")]


def capability_problems(p: HostHealthParams, g: GpuHealth) -> list[Problem]:
    """GPUs whose compute capability is not the expected one (unknown ones pass)."""
    if not p.compute_capability:
        return []
    wrong = [d for d in g.devices if d.compute_capability not in (None, p.compute_capability)]
    if not wrong:
        return []
    return [Problem(
        "compute-capability", f"compute capability differs from {p.compute_capability}: "
        + _each(wrong, "GPU {d.index} ({d.name}) is {d.compute_capability}"),
        "deploy to the intended box, or change compute_capability (kernels and "
        "attention backends depend on it: sm_120 needs flashinfer or triton)")]


def ecc_problems(p: HostHealthParams, g: GpuHealth) -> list[Problem]:
    """GPUs with more uncorrected volatile ECC errors than max_ecc_errors."""
    bad = [d for d in g.devices
           if d.ecc_uncorrected is not None and d.ecc_uncorrected > p.max_ecc_errors]
    if not bad:
        return []
    return [Problem(
        "ecc", f"uncorrected ECC errors above {p.max_ecc_errors}: "
        + _each(bad, "GPU {d.index} has {d.ecc_uncorrected}"),
        "reset the GPU with nothing running on it (`nvidia-smi -r -i N` on the "
        "hypervisor) or reboot the host; errors that come back mean failing memory")]


def driver_problems(p: HostHealthParams, g: GpuHealth) -> list[Problem]:
    """The driver is older than min_driver."""
    driver = g.driver_version
    if not (p.min_driver and driver and version_less(driver, p.min_driver)):
        return []
    return [Problem(
        "driver", f"NVIDIA driver {driver} is older than {p.min_driver} (570.26 is the "
        "minimum for sm_120 / RTX PRO 6000 Blackwell, CUDA 12.8)",
        f"install driver >= {p.min_driver} on the hypervisor (kernel module) and the same "
        "version's user-space libraries in the container (`--no-kernel-module`); a "
        "version mismatch between the two gives CUDA error 803")]


def busy_problem(procs: tuple[GpuUser, ...]) -> Problem:
    """Processes hold GPU memory: one line per HOST pid, with its GPUs as ranges."""
    by_pid: dict[int, tuple[str | None, int, list[int]]] = {}
    for pr in procs:
        name, mib, gpus = by_pid.get(pr.pid, (pr.name, 0, []))
        if pr.gpu_index is not None:
            gpus.append(pr.gpu_index)
        by_pid[pr.pid] = (name, mib + (pr.used_mib or 0), gpus)
    desc = "; ".join(
        f"PID {pid} ({name or '?'}) holds {mib} MiB on GPU {ranges(gpus)}"
        for pid, (name, mib, gpus) in sorted(by_pid.items()))
    pids = " ".join(str(pid) for pid in sorted(by_pid))
    return Problem(
        "busy", f"GPU memory is in use: {desc}",
        f"these are HOST pids (NVML is not namespaced; in a container they may only exist "
        f"on the hypervisor): stop them with `kill {pids}` (then `kill -9 {pids}` if they "
        "stay) where `ps -p PID` finds them, or set allow_busy_gpus: true")


# ------------------------------------------------------------------------------ shm, disk


def shm_problems(p: HostHealthParams, shm: ShmFacts, ctid: str) -> list[Problem]:
    """/dev/shm smaller than min_shm_gib (or unreadable)."""
    if p.min_shm_gib is None:
        return []
    size = shm.size
    if size is not None and size >= p.min_shm_gib * GIB:
        return []
    want = max(1, int(-(-p.min_shm_gib // 1)))
    have = "missing" if size is None else (
        f"{size / MIB:.0f} MiB" if size < GIB else f"{size / GIB:.1f} GiB")
    return [Problem(
        "shm", f"/dev/shm is {have}, need >= {p.min_shm_gib:g} GiB (NCCL crashes in "
        "ncclShmOpen when it is too small)",
        f"LXC: add `lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size={want}G,"
        f"create=dir 0 0` to /etc/pve/lxc/{ctid}.conf and restart the container; plain "
        f"host: `mount -o remount,size={want}G /dev/shm` (and in /etc/fstab); docker: "
        f"`--shm-size={want}g` or `--ipc=host`")]


def disk_problems(disk: DiskBudget | None) -> list[Problem]:
    """disk_path cannot hold what the models need (what is there counts)."""
    if disk is None or not disk.needed:
        return []
    needed, present, free = disk.needed, disk.present, disk.free
    if free + present >= needed:
        return []
    short = needed - present - free
    return [Problem(
        "disk", f"{disk.path} needs {gib(needed)} in total: {gib(present)} already "
        f"there, only {gib(free)} free on the filesystem of {disk.checked_path} "
        f"(short by {gib(short)})",
        f"free {gib(short)} there, or point disk_path (models_dir) at a bigger disk")]


# ------------------------------------------------------------------------------ the verdict


def problems(p: HostHealthParams, facts: HealthFacts, hv: HypervisorSpec | None,
             can_fix: bool = True) -> list[Problem]:
    """Every expectation these facts do not meet, in the order the error lists them.

    `can_fix`: whether the container may be restarted (not when this run lives in it)."""
    g, ctid = facts.gpus, ctid_of(hv)
    out = gpu_listing_problems(p, g, facts.xid, ctid)
    out += memory_problems(p, g) + driver_problems(p, g)
    out += capability_problems(p, g) + ecc_problems(p, g)
    if g.processes and not p.allow_busy_gpus:
        out.append(busy_problem(g.processes))
    if p.require_cuda and (facts.uvm.cuda_init is not None or cuda_init_needed(p, g, facts.uvm)):
        out += cuda_problems(p, facts.uvm, hv, can_fix=can_fix)  # (else proven: every GPU busy)
    out += shm_problems(p, facts.shm, ctid)
    out += disk_problems(facts.disk)
    return out


def repair(found: list[Problem]) -> Problem | None:
    """The problem apply() repairs: the first remediable one, when nothing else is wrong."""
    if not found or any(not pr.remediable for pr in found):
        return None
    return found[0]


def failure_text(host: str, found: list[Problem]) -> str:
    """The PreflightError message: every problem with its fix."""
    n = len(found)
    return (f"host {host} is not fit to serve ({n} problem{'s' if n != 1 else ''}):\n"
            + "\n".join(pr.render() for pr in found))


@dataclass(frozen=True)
class HypervisorView:
    """The hypervisor as apply would find it: its conf, current uvm major, and the edit."""

    conf_path: str
    text: str
    major: int | None
    edit: UvmEdit | None

    @classmethod
    def of(cls, conf_path: str, text: str, uvm: UvmFacts) -> HypervisorView:
        """Plan the conf edit from the hypervisor's own uvm facts."""
        major = uvm.proc_major
        edit = plan_uvm_allow(text, major, uvm.registered) if major is not None else None
        return cls(conf_path, text, major, edit)


def repair_reason(what: str, hv: HypervisorSpec, view: HypervisorView | None,
                  unreadable: str | None = None) -> str:
    """The Needed reason: the problem and the repair plan step by step (dry-run shows it)."""
    ctid = hv.ctid
    steps = f"run `{MODPROBE}` on {hv.host}; "
    if view is None:
        steps += (f"set `{allow_line('<current major>')}` in /etc/pve/lxc/{ctid}.conf "
                  f"(hypervisor not readable now: {unreadable})")
    elif view.edit is None:
        steps += (f"then set `{allow_line('<major it gets>')}` in {view.conf_path} (the "
                  "nvidia-uvm module is not loaded there yet)")
    else:
        steps += view.edit.describe(view.conf_path)
        if view.edit.changed:
            steps += " (backup next to it)"
    steps += f"; restart the container: pct stop {ctid} && pct start {ctid}"
    return f"{what}. Repair plan (through hypervisor {hv.host}): {steps}"


def verify_failure(uvm: UvmFacts, hv: HypervisorSpec | None) -> tuple[str, str] | None:
    """After the repair: None when CUDA works, else (what is still wrong, hint)."""
    cuda = uvm.cuda_init
    symptoms = uvm_symptoms(uvm)
    code = cuda.code if cuda else None
    if code == 0 and not symptoms:
        return None
    what = "; ".join(symptoms) or "no uvm symptom left"
    hint = uvm_manual_fix(uvm.proc_major, hv)
    if not uvm.node.present:
        hint = ("the container has no /dev/nvidia-uvm: add `lxc.mount.entry: "
                "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file` (and the "
                f"same for nvidia-uvm-tools) to /etc/pve/lxc/{ctid_of(hv)}.conf; " + hint)
    name = (cuda.name or cuda.error) if cuda else None
    return f"after the repair CUDA init returns {code} ({name}); {what}", hint


def summary(facts: HealthFacts) -> str:
    """The Converged reason: GPUs, driver, CUDA init, /dev/shm, free disk."""
    g = facts.gpus
    names = sorted({str(d.name) for d in g.devices})
    mem = min((d.memory_total_mib or 0 for d in g.devices), default=0) / 1024
    parts = [f"{len(g.devices)} x {'/'.join(names) or 'GPU'} ({mem:.1f} GiB)",
             f"driver {g.driver_version} / CUDA {g.cuda_driver_version} (via {g.source})"]
    cuda = facts.uvm.cuda_init
    if cuda is not None:
        parts.append(f"CUDA init {cuda.code} (uvm major {facts.uvm.proc_major})")
    elif facts.uvm.open.ok:
        parts.append(f"/dev/nvidia-uvm opens (major {facts.uvm.proc_major})")
    if facts.shm.size is not None:
        parts.append(f"/dev/shm {gib(facts.shm.size)}")
    if facts.disk is not None:
        parts.append(f"{gib(facts.disk.free)} free at {facts.disk.path}")
    return ", ".join(parts)
