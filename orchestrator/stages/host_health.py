"""The `host_health` stage kind: is this GPU host fit to serve, and fix nvidia-uvm if not.

    - id: health
      uses: host_health
      with:
        gpus: 8                      # at least this many GPUs
        min_gpu_memory_gib: 90       # per GPU
        min_driver: "570.26"         # the minimum driver for sm_120 (CUDA 12.8)
        compute_capability: "12.0"   # every GPU must report exactly this
        require_cuda: true           # cuInit(0) must return 0 (checks /dev/nvidia-uvm too)
        min_shm_gib: 16              # /dev/shm size (NCCL)
        disk_path: "{{ models_dir }}"
        disk_needed_gib: 600         # what disk_path needs in total; what is there counts
        max_ecc_errors: 0            # uncorrected volatile ECC errors per GPU
        allow_busy_gpus: false       # processes holding GPU memory fail the check
        fix_uvm: true                # repair nvidia-uvm through the Proxmox hypervisor
        restart_wait: 5m             # SSH budget after the container restart

`check` runs the probes of `orchestrator.remote.gpu` on the host, records every fact (`gpus`,
`uvm`, `shm`, `disk`, `xid`) and collects EVERY problem. Problems it cannot fix raise one
StageError listing each with what to do. The one problem it can fix is nvidia-uvm in an LXC
container (FACTS.md): the uvm device major is dynamic, and the container's device cgroup
(`lxc.cgroup2.devices.allow` in /etc/pve/lxc/<ctid>.conf on the hypervisor) still names an old
one, or none; `nvidia-smi` works but cuInit returns 999. When `fix_uvm` is on and the inventory
gives the host a `hypervisor: {host, ctid}`, check answers Needed and `apply`:

  1. runs `nvidia-modprobe -u -c=0` on the hypervisor (module loaded, nodes created);
  2. reads the CURRENT uvm major from the hypervisor's /proc/devices;
  3. reads /etc/pve/lxc/<ctid>.conf, writes a backup next to it
     (<ctid>.conf.orchestrator-<run_id>.bak, recorded as `uvm_fix.backup`), and rewrites the
     stale uvm allow line to the current major (or adds the line; the 195 line and everything
     else are left untouched) with an atomic write;
  4. restarts the container: `pct stop <ctid> && pct start <ctid>`. This KILLS every process
     in the container (a running server included) - expected: the GPUs are unusable anyway.
     It runs detached (setsid) on the hypervisor, so a dropped SSH session cannot stop it
     between the stop and the start and leave the container down;
  5. waits (up to `restart_wait`) for the container's SSH to come back and reconnects.

`verify` probes again in the container: cuInit(0) must now return 0. Without a hypervisor in
the inventory (or with `fix_uvm: false`) the StageError gives the exact conf line and the
commands to run on the hypervisor. In --dry-run the Needed reason says exactly which line of
which file would change.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator, model_validator

from orchestrator.config.model import HypervisorSpec, parse_duration
from orchestrator.errors import (
    OrchestratorError,
    PreflightError,
    StageError,
    TransientConnectError,
)
from orchestrator.host import Host
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext

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
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


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
    restart_wait: float = Field(
        300.0, description="how long to wait for SSH after the container restart (30s, 5m)")

    @field_validator("restart_wait", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)

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


# ------------------------------------------------------------------------------ pure helpers


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
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def allow_line(major: int | str) -> str:
    """The Proxmox conf line that lets a container use the uvm device of `major`."""
    return f"lxc.cgroup2.devices.allow: c {major}:* rwm"


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if parts and parts[-1][1] == i - 1:
            parts[-1] = (parts[-1][0], i)
        else:
            parts.append((i, i))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


@dataclass
class UvmEdit:
    """What to do to a container conf so its device cgroup allows the uvm `major`."""

    action: str  # "present" | "replaced" | "added" | "passthrough"
    major: int
    text: str  # the conf after the edit (== before for present/passthrough)
    changes: list[tuple[int, str, str]] = field(default_factory=list)  # (line, old, new)

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def describe(self, path: str) -> str:
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
    allows: list[tuple[int, re.Match[str]]] = []
    for i in range(end):
        body = lines[i].rstrip("\r\n")
        if body.lstrip().startswith("#"):
            continue
        if _DEV_UVM.match(body):
            return UvmEdit("passthrough", major, conf)
        m = _ALLOW.match(body)
        if m:
            allows.append((i, m))
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


def uvm_symptoms(uvm: dict[str, Any]) -> list[str]:
    """What is wrong with /dev/nvidia-uvm in these uvm_facts (empty when it is usable)."""
    out: list[str] = []
    proc = uvm.get("proc_major")
    node = uvm.get("node") or {}
    opened = uvm.get("open") or {}
    cg = uvm.get("cgroup") or {}
    if proc is None:
        out.append("the nvidia-uvm module is not loaded (no nvidia-uvm line in /proc/devices)")
    if not node.get("present"):
        out.append("/dev/nvidia-uvm does not exist here")
    elif uvm.get("major_match") is False:
        out.append(f"/dev/nvidia-uvm has major {node.get('major')} but the kernel's nvidia-uvm "
                   f"major is {proc} (a stale node from before a reboot or driver update)")
    errno_name = opened.get("errno")
    if node.get("present") and errno_name == "EPERM":
        out.append(f"open('/dev/nvidia-uvm', O_RDWR) is refused (EPERM): the device cgroup "
                   f"does not allow major {node.get('major')}")
    elif node.get("present") and errno_name and errno_name != "ENOENT":
        out.append(f"open('/dev/nvidia-uvm', O_RDWR) fails: {errno_name} {opened.get('error')}")
    if cg.get("allows_uvm") is False and errno_name != "EPERM":
        out.append(f"cgroup v1 devices.list does not allow c {node.get('major') or proc}:0")
    return out


@dataclass
class Problem:
    """One thing wrong with the host, and what to do about it."""

    key: str
    what: str
    fix: str
    remediable: bool = False

    def render(self) -> str:
        return f"- {self.what}\n    fix: {self.fix}"


# ------------------------------------------------------------------------------ the stage


class HostHealthStage(Stage, kind="host_health"):
    """Check GPUs, driver, CUDA/nvidia-uvm, /dev/shm and disk; repair uvm via the hypervisor."""

    Params = HostHealthParams
    params: HostHealthParams

    def __init__(self, params: HostHealthParams) -> None:
        super().__init__(params)
        self._hv_open: tuple[StageContext, Host] | None = None

    # ---- facts -------------------------------------------------------------------------------
    def _facts(self, host: Host, ctx: StageContext) -> dict[str, Any]:
        p = self.params
        facts: dict[str, Any] = {
            "gpus": host.probe("gpu_facts"),
            "uvm": host.probe("uvm_facts", cuda=p.require_cuda),
            "shm": host.probe("shm_facts"),
            "xid": host.probe("kernel_xid"),
        }
        if p.disk_path:
            disk = dict(host.probe("disk_free", path=p.disk_path))
            usage = host.probe("dir_usage", path=p.disk_path)
            disk["present"] = usage.get("bytes", 0)
            disk["needed"] = int(p.disk_needed_gib * GIB) if p.disk_needed_gib else None
            facts["disk"] = disk
        for key, value in facts.items():
            ctx.record(key, value)
        return facts

    def _hypervisor(self, host: Host, ctx: StageContext) -> HypervisorSpec | None:
        spec = ctx.inventory_hosts.get(host.name) or host.spec
        return getattr(spec, "hypervisor", None)

    # ---- evaluation --------------------------------------------------------------------------
    def problems(self, facts: dict[str, Any], host: Host,
                 hv: HypervisorSpec | None) -> list[Problem]:
        """Every expectation not met by these facts (pure: no host access)."""
        p = self.params
        out: list[Problem] = []
        g = facts["gpus"]
        devices = g.get("devices") or []
        xid = facts.get("xid") or {}
        ctid = str(hv.ctid) if hv else "<CTID>"
        if g.get("source") is None:
            out.append(Problem(
                "gpu-tool", f"no GPU could be listed: {g.get('error')}",
                "install the NVIDIA driver (nvidia-smi, libnvidia-ml.so.1) matching the "
                "hypervisor's kernel module; in an LXC container pass the nodes through "
                "(`lxc.cgroup2.devices.allow: c 195:* rwm` and `lxc.mount.entry: /dev/nvidia0 "
                f"dev/nvidia0 none bind,optional,create=file` ... in /etc/pve/lxc/{ctid}.conf)"))
        elif p.gpus is not None and len(devices) < p.gpus:
            lost = [e for e in xid.get("events") or [] if e.get("code") == 79]
            what = f"found {len(devices)} GPUs, expected {p.gpus}"
            if lost:
                what += "; kernel log: " + " | ".join(e["line"] for e in lost[-3:])
                fix = ("Xid 79: the GPU fell off the bus: power-cycle the host (a cold power "
                       "cycle, not only a reboot); if it happens again, reseat or replace it")
            else:
                fix = ("check `nvidia-smi -L` and `dmesg | grep -i nvrm` on the hypervisor; "
                       "a GPU that is not listed needs a power-cycle of the host; in an LXC "
                       "container check the /dev/nvidiaN mount entries of "
                       f"/etc/pve/lxc/{ctid}.conf")
            out.append(Problem("gpu-count", what, fix))
        if p.min_gpu_memory_gib is not None:
            need = p.min_gpu_memory_gib * 1024
            small = [d for d in devices if (d.get("memory_total_mib") or 0) < need]
            if small:
                out.append(Problem(
                    "gpu-memory",
                    "GPU memory below {} GiB: {}".format(p.min_gpu_memory_gib, ", ".join(
                        f"GPU {d.get('index')} ({d.get('name')}) has "
                        f"{(d.get('memory_total_mib') or 0) / 1024:.1f} GiB" for d in small)),
                    "use GPUs with enough memory, or lower min_gpu_memory_gib if the model fits"))
        driver = g.get("driver_version")
        if p.min_driver and driver and version_less(driver, p.min_driver):
            out.append(Problem(
                "driver", f"NVIDIA driver {driver} is older than {p.min_driver} (570.26 is the "
                "minimum for sm_120 / RTX PRO 6000 Blackwell, CUDA 12.8)",
                f"install driver >= {p.min_driver} on the hypervisor (kernel module) and the same "
                "version's user-space libraries in the container (`--no-kernel-module`); a "
                "version mismatch between the two gives CUDA error 803"))
        if p.compute_capability:
            wrong = [d for d in devices if d.get("compute_capability") not in
                     (None, p.compute_capability)]
            if wrong:
                out.append(Problem(
                    "compute-capability", "compute capability differs from {}: {}".format(
                        p.compute_capability, ", ".join(
                            f"GPU {d.get('index')} ({d.get('name')}) is "
                            f"{d.get('compute_capability')}" for d in wrong)),
                    "deploy to the intended box, or change compute_capability (kernels and "
                    "attention backends depend on it: sm_120 needs flashinfer or triton)"))
        bad_ecc = [d for d in devices if d.get("ecc_uncorrected") is not None
                   and d["ecc_uncorrected"] > p.max_ecc_errors]
        if bad_ecc:
            out.append(Problem(
                "ecc", "uncorrected ECC errors above {}: {}".format(p.max_ecc_errors, ", ".join(
                    f"GPU {d.get('index')} has {d['ecc_uncorrected']}" for d in bad_ecc)),
                "reset the GPU with nothing running on it (`nvidia-smi -r -i N` on the "
                "hypervisor) or reboot the host; errors that come back mean failing memory"))
        procs = g.get("processes") or []
        if procs and not p.allow_busy_gpus:
            out.append(self._busy_problem(procs))
        if p.require_cuda:
            # restarting the container we run in would kill this very run
            out.extend(self._cuda_problems(facts["uvm"], hv,
                                           can_fix=host.spec.connection != "local"))
        out.extend(self._shm_problem(facts["shm"], ctid))
        if "disk" in facts and facts["disk"].get("needed"):
            out.extend(self._disk_problem(facts["disk"]))
        return out

    @staticmethod
    def _busy_problem(procs: list[dict[str, Any]]) -> Problem:
        by_pid: dict[int, dict[str, Any]] = {}
        for pr in procs:
            e = by_pid.setdefault(pr["pid"], {"name": pr.get("name"), "mib": 0, "gpus": []})
            e["mib"] += pr.get("used_mib") or 0
            if pr.get("gpu_index") is not None:
                e["gpus"].append(pr["gpu_index"])
        desc = "; ".join(
            f"PID {pid} ({e['name'] or '?'}) holds {e['mib']} MiB on GPU {_ranges(e['gpus'])}"
            for pid, e in sorted(by_pid.items()))
        pids = " ".join(str(pid) for pid in sorted(by_pid))
        return Problem(
            "busy", f"GPU memory is in use: {desc}",
            f"these are HOST pids (NVML is not namespaced; in a container they may only exist "
            f"on the hypervisor): stop them with `kill {pids}` (then `kill -9 {pids}` if they "
            "stay) where `ps -p PID` finds them, or set allow_busy_gpus: true")

    def _cuda_problems(self, uvm: dict[str, Any], hv: HypervisorSpec | None,
                       can_fix: bool = True) -> list[Problem]:
        out: list[Problem] = []
        cuda = uvm.get("cuda_init") or {}
        code = cuda.get("code")
        symptoms = uvm_symptoms(uvm)
        major = uvm.get("proc_major")
        if symptoms:
            what = "nvidia-uvm is unusable here: " + "; ".join(symptoms)
            if code not in (None, 0):
                what += f"; CUDA init returns {code} ({cuda.get('name')})"
            fixable = self.params.fix_uvm and hv is not None and can_fix
            fix = self._uvm_manual_fix(major, hv, automatic=fixable)
            out.append(Problem("uvm", what, fix, remediable=fixable))
        if code is None:
            out.append(Problem(
                "cuda", f"CUDA init could not be tested: {cuda.get('error') or 'no libcuda'}",
                "install the user-space driver library libcuda.so.1 of the same version as the "
                "host's kernel module (e.g. the libcuda1 / libnvidia-compute package, or the "
                ".run installer with --no-kernel-module), or set require_cuda: false"))
        elif code == 35:
            out.append(Problem(
                "cuda", "CUDA init returns 35 (CUDA_ERROR_INSUFFICIENT_DRIVER): the driver is "
                "too old for this CUDA / GPU", "install driver >= 570.26 (CUDA 12.8, the sm_120 "
                "minimum) on the hypervisor and the same version in the container"))
        elif code == 803:
            out.append(Problem(
                "cuda", "CUDA init returns 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH): the "
                "container's libcuda differs from the host's kernel module version",
                "install exactly the hypervisor's driver version in the container "
                "(`--no-kernel-module`), compare `cat /proc/driver/nvidia/version` with "
                "`nvidia-smi`"))
        elif code not in (0, 999) or (code == 999 and not symptoms):
            out.append(Problem(
                "cuda", f"CUDA init returns {code} ({cuda.get('name')})"
                + (" although /dev/nvidia-uvm opens fine" if code == 999 else ""),
                "look at `dmesg | grep -i -e nvrm -e xid` on the hypervisor and `nvidia-smi` "
                f"here; `{MODPROBE}` on the hypervisor and a restart of the container often "
                "help"))
        return out

    @staticmethod
    def _uvm_manual_fix(major: int | None, hv: HypervisorSpec | None,
                        automatic: bool = False) -> str:
        ctid = str(hv.ctid) if hv else "<CTID>"
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

    def _shm_problem(self, shm: dict[str, Any], ctid: str) -> list[Problem]:
        p = self.params
        if p.min_shm_gib is None:
            return []
        size = shm.get("size")
        need = p.min_shm_gib * GIB
        if size is not None and size >= need:
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

    def _disk_problem(self, disk: dict[str, Any]) -> list[Problem]:
        needed, present, free = disk["needed"], disk.get("present") or 0, disk.get("free") or 0
        if free + present >= needed:
            return []
        short = needed - present - free
        return [Problem(
            "disk", f"{disk.get('path')} needs {gib(needed)} in total: {gib(present)} already "
            f"there, only {gib(free)} free on the filesystem of {disk.get('checked_path')} "
            f"(short by {gib(short)})",
            f"free {gib(short)} there, or point disk_path (models_dir) at a bigger disk")]

    # ---- hypervisor --------------------------------------------------------------------------
    def _open_hypervisor(self, ctx: StageContext, hv: HypervisorSpec) -> Host:
        if self._hv_open is not None and self._hv_open[0] is ctx:
            return self._hv_open[1]
        if ctx.open_host is None:
            raise StageError(f"cannot reach the hypervisor {hv.host}: this run gives stages no "
                             "access to other inventory hosts")
        h = ctx.open_host(hv.host)
        self._hv_open = (ctx, h)
        return h

    def _plan(self, h: Host, hv: HypervisorSpec) -> tuple[str, str, int | None, UvmEdit | None]:
        """(conf path, conf text, current uvm major, edit) as the hypervisor is now."""
        conf_path = f"/etc/pve/lxc/{hv.ctid}.conf"
        facts = h.probe("uvm_facts", cuda=False)
        major = facts.get("proc_major")
        text = h.read_text(conf_path)
        if text is None:
            raise StageError(
                f"{h.name}: {conf_path} does not exist: container {hv.ctid} is not on this "
                "hypervisor", hint=f"check `pct list` on {h.name} and the inventory's "
                "`hypervisor: {host, ctid}` of this host")
        registered = {int(k): v for k, v in (facts.get("char_devices") or {}).items()}
        edit = plan_uvm_allow(text, int(major), registered) if major is not None else None
        return conf_path, text, major, edit

    def _needed_reason(self, problem: Problem, ctx: StageContext, hv: HypervisorSpec) -> str:
        ctid = hv.ctid
        steps = f"run `{MODPROBE}` on {hv.host}; "
        try:
            h = self._open_hypervisor(ctx, hv)
            conf_path, _text, major, edit = self._plan(h, hv)
        except OrchestratorError as exc:
            steps += (f"set `{allow_line('<current major>')}` in /etc/pve/lxc/{ctid}.conf "
                      f"(hypervisor not readable now: {exc.message})")
        else:
            if edit is None:
                steps += (f"then set `{allow_line('<major it gets>')}` in {conf_path} (the "
                          "nvidia-uvm module is not loaded there yet)")
            else:
                steps += f"{edit.describe(conf_path)}"
                if edit.changed:
                    steps += " (backup next to it)"
        steps += f"; restart the container: pct stop {ctid} && pct start {ctid}"
        return f"{problem.what}. Repair plan (through hypervisor {hv.host}): {steps}"

    # ---- the stage interface -----------------------------------------------------------------
    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        facts = self._facts(host, ctx)
        hv = self._hypervisor(host, ctx)
        problems = self.problems(facts, host, hv)
        fixable = [pr for pr in problems if pr.remediable]
        if len(fixable) < len(problems):
            n = len(problems)
            raise PreflightError(
                f"host {host.name} is not fit to serve ({n} problem{'s' if n != 1 else ''}):\n"
                + "\n".join(pr.render() for pr in problems),
                hint="fix these on the host and run again (facts are in the run record)")
        if fixable:
            assert hv is not None
            return Needed(self._needed_reason(fixable[0], ctx, hv))
        return Converged(self._summary(facts))

    def apply(self, host: Host, ctx: StageContext) -> None:
        """Repair nvidia-uvm through the hypervisor (the container restart kills its processes)."""
        hv = self._hypervisor(host, ctx)
        if hv is None:  # check() only answers Needed with a hypervisor
            raise StageError(f"{host.name}: no hypervisor configured to repair nvidia-uvm")
        h = self._open_hypervisor(ctx, hv)
        ctid = hv.ctid
        ctx.progress(f"{h.name}: {MODPROBE}")
        h.run(MODPROBE, timeout=120, check=True, what=f"{MODPROBE} on {h.name}",
              hint="run it as root on the hypervisor; the nvidia driver must be installed there")
        conf_path, text, major, edit = self._plan(h, hv)
        if major is None or edit is None:
            raise StageError(
                f"{h.name}: the nvidia-uvm module is still not loaded after `{MODPROBE}` (no "
                "nvidia-uvm line in /proc/devices)",
                hint=f"on {h.name}: `modprobe nvidia-uvm`, check `dmesg | grep -i nvidia`")
        record: dict[str, Any] = {"hypervisor": h.name, "ctid": ctid, "conf": conf_path,
                                  "major": major, "action": edit.action, "backup": None,
                                  "changes": [list(c) for c in edit.changes]}
        if edit.changed:
            backup = f"{conf_path}.orchestrator-{_SAFE.sub('_', ctx.run_id)}.bak"
            if h.read_file(backup) is None:  # a retry keeps the first (original) backup
                h.write_file(backup, text, mode=0o640)
            record["backup"] = backup
            ctx.progress(f"{h.name}: {edit.describe(conf_path)}")
            try:
                h.write_file(conf_path, edit.text)
            except OrchestratorError as exc:
                raise StageError(
                    f"{h.name}: could not write {conf_path}: {exc.message}",
                    hint=f"edit it by hand: {edit.describe(conf_path)}; then "
                    f"`pct stop {ctid} && pct start {ctid}`") from exc
            ctx.log.info("uvm.conf_rewritten", hypervisor=h.name, conf=conf_path,
                         major=major, backup=backup)
        ctx.record("uvm_fix", record)
        self._restart_container(host, h, ctid, ctx)

    def _restart_container(self, host: Host, h: Host, ctid: int, ctx: StageContext) -> None:
        wait = self.params.restart_wait
        ctx.progress(f"{h.name}: restarting container {ctid} ({host.name}); every process in "
                     "it is stopped")
        host.transport.close()  # the container's processes (our agent too) are about to die
        try:
            _restart_detached(h, ctid, timeout=max(120.0, wait))
        except BaseException:
            with contextlib.suppress(OrchestratorError):  # leave the host usable if it is up
                host.transport.connect(budget=min(wait, 30.0))
            raise
        ctx.progress(f"waiting up to {wait:.0f}s for SSH on {host.name}")
        transport = host.transport
        previous = getattr(transport, "on_wait", None)
        if hasattr(transport, "on_wait"):
            transport.on_wait = lambda attempt, elapsed, exc: ctx.progress(
                f"waiting for SSH on {host.name} after the restart: {elapsed:.0f}s of "
                f"{wait:.0f}s ({exc})")
        try:
            transport.connect(budget=wait)
        except TransientConnectError as exc:
            raise StageError(
                f"{host.name} did not come back within {wait:.0f}s after `pct start {ctid}` "
                f"on {h.name}: {exc.message}",
                hint=f"on {h.name}: `pct status {ctid}`, `pct enter {ctid}`; raise "
                "restart_wait if it boots slowly") from exc
        finally:
            if hasattr(transport, "on_wait"):
                transport.on_wait = previous
        ctx.progress(f"{host.name} is back")

    def verify(self, host: Host, ctx: StageContext) -> None:
        uvm = host.probe("uvm_facts", cuda=True)
        ctx.record("uvm_after", uvm)
        cuda = uvm.get("cuda_init") or {}
        symptoms = uvm_symptoms(uvm)
        if cuda.get("code") == 0 and not symptoms:
            return
        hv = self._hypervisor(host, ctx)
        what = "; ".join(symptoms) or "no uvm symptom left"
        hint = self._uvm_manual_fix(uvm.get("proc_major"), hv)
        node = uvm.get("node") or {}
        if not node.get("present"):
            ctid = hv.ctid if hv else "<CTID>"
            hint = ("the container has no /dev/nvidia-uvm: add `lxc.mount.entry: "
                    "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file` (and the "
                    f"same for nvidia-uvm-tools) to /etc/pve/lxc/{ctid}.conf; " + hint)
        raise StageError(
            f"{host.name}: after the repair CUDA init returns {cuda.get('code')} "
            f"({cuda.get('name') or cuda.get('error')}); {what}", hint=hint)

    # ---- summary -----------------------------------------------------------------------------
    @staticmethod
    def _summary(facts: dict[str, Any]) -> str:
        g = facts["gpus"]
        devices = g.get("devices") or []
        names = sorted({str(d.get("name")) for d in devices})
        mem = min((d.get("memory_total_mib") or 0 for d in devices), default=0) / 1024
        parts = [f"{len(devices)} x {'/'.join(names) or 'GPU'} ({mem:.1f} GiB)",
                 f"driver {g.get('driver_version')} / CUDA {g.get('cuda_driver_version')} "
                 f"(via {g.get('source')})"]
        cuda = (facts.get("uvm") or {}).get("cuda_init")
        if cuda:
            parts.append(f"CUDA init {cuda.get('code')} (uvm major "
                         f"{facts['uvm'].get('proc_major')})")
        shm = facts.get("shm") or {}
        if shm.get("size") is not None:
            parts.append(f"/dev/shm {gib(shm['size'])}")
        disk = facts.get("disk")
        if disk:
            parts.append(f"{gib(disk.get('free'))} free at {disk.get('path')}")
        return ", ".join(parts)


def _restart_detached(h: Host, ctid: int, timeout: float) -> None:
    """`pct stop CTID && pct start CTID` on the hypervisor, detached from our SSH session.

    Run as a plain command, a session cut between the stop and the start (the agent kills its
    commands when the connection drops) would leave the container STOPPED, and nothing could
    reach it again. So the restart runs in its own session (setsid) and records its output and
    exit status under ~/.orchestrator/pct-restart-CTID-TOKEN/ on the hypervisor; we poll for
    the status, reconnecting as needed. The job starts at most once per call (mkdir guard), so
    a launch that is cut and re-sent never restarts the container twice.
    """
    job = f'"$HOME"/.orchestrator/pct-restart-{int(ctid)}-{secrets.token_hex(4)}'
    restart = (f"if pct status {int(ctid)} | grep -q running; then pct stop {int(ctid)}; fi "
               f"&& pct start {int(ctid)}")
    inner = (f'mkdir "$0" 2>/dev/null || exit 0; ({restart}) >"$0/log" 2>&1; '
             'echo $? >"$0/rc.tmp" && mv "$0/rc.tmp" "$0/rc"')
    launch = (f"mkdir -p \"$HOME\"/.orchestrator && setsid sh -c {shlex.quote(inner)} {job} "
              "</dev/null >/dev/null 2>&1 &")
    hint = (f"on {h.name}: `pct status {ctid}`, `pct start {ctid}`; see /var/log/pve/tasks or "
            f"`journalctl -u pve-container@{ctid}`")
    deadline = time.monotonic() + timeout
    launched = False
    while True:
        try:
            if not launched:
                h.run(launch, timeout=30, check=True,
                      what=f"starting the restart of container {ctid} on {h.name}", hint=hint)
                launched = True
            res = h.run(f"cat {job}/rc 2>/dev/null", timeout=30)
            if res.stdout.strip():
                break
        except TransientConnectError:
            pass  # the session was cut: the next call reconnects (a re-sent launch is a no-op)
        if time.monotonic() > deadline:
            raise StageError(
                f"restarting container {ctid} on {h.name} did not finish within {timeout:.0f}s: "
                f"{restart}", hint=hint)
        time.sleep(0.2)
    code = int(res.stdout.strip()) if res.stdout.strip().lstrip("-").isdigit() else -1
    out = ""
    for _ in range(2):  # the restart is done: a cut here must not fail the stage
        try:
            out = h.run(f"cat {job}/log 2>/dev/null; rm -rf {job}", timeout=30).stdout
            break
        except TransientConnectError:
            continue
    if code != 0:
        tail = "\n".join("    " + ln for ln in out.rstrip().splitlines()[-20:])
        raise StageError(
            f"restarting container {ctid} on {h.name} failed: exit code {code}\n"
            f"  command: {restart}" + (f"\n  output (last lines):\n{tail}" if tail else ""),
            hint=hint)
