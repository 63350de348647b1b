"""What a GPU host's hardware surface says: the answers of orchestrator.remote.gpu's probes
(gpu_facts, uvm_facts, shm_facts, kernel_xid, dir_usage) and of disk_free, typed.

Each class mirrors its probe's answer field for field (so `to_data(fact)` is what the run
record shows); a field the answer lacks reads as None (or empty). host_health reads hosts
only through these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orchestrator.facts.base import as_bool as _bool
from orchestrator.facts.base import as_dict as _d
from orchestrator.facts.base import as_int as _int
from orchestrator.facts.base import as_list as _l
from orchestrator.facts.base import as_str as _str
from orchestrator.facts.base import fact

# ------------------------------------------------------------------------------ gpu_facts


@dataclass(frozen=True)
class GpuBoard:
    """One GPU as NVML or nvidia-smi lists it (None: not reported / not supported)."""

    index: int | None
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    compute_capability: str | None
    ecc_uncorrected: int | None
    persistence_mode: bool | None
    pcie_gen: int | None
    pcie_width: int | None
    error: str | None = None
    errors: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_answer(cls, a: Any) -> GpuBoard:
        """One entry of gpu_facts' `devices`."""
        a = _d(a)
        return cls(
            index=_int(a.get("index")), name=_str(a.get("name")), uuid=_str(a.get("uuid")),
            pci_bus_id=_str(a.get("pci_bus_id")),
            memory_total_mib=_int(a.get("memory_total_mib")),
            memory_used_mib=_int(a.get("memory_used_mib")),
            compute_capability=_str(a.get("compute_capability")),
            ecc_uncorrected=_int(a.get("ecc_uncorrected")),
            persistence_mode=_bool(a.get("persistence_mode")),
            pcie_gen=_int(a.get("pcie_gen")), pcie_width=_int(a.get("pcie_width")),
            error=_str(a.get("error")),
            errors=tuple(sorted((str(k), str(v)) for k, v in _d(a.get("errors")).items())))

    @property
    def memory_gib(self) -> float:
        """Total memory in GiB (0 when unknown)."""
        return (self.memory_total_mib or 0) / 1024


@dataclass(frozen=True)
class GpuUser:
    """A compute process holding GPU memory; `pid` is a HOST pid (NVML is not namespaced)."""

    pid: int
    gpu_index: int | None
    gpu_uuid: str | None
    used_mib: int | None
    name: str | None

    @classmethod
    def from_answer(cls, a: Any) -> GpuUser:
        """One entry of gpu_facts' `processes`."""
        a = _d(a)
        return cls(pid=_int(a.get("pid")) or 0, gpu_index=_int(a.get("gpu_index")),
                   gpu_uuid=_str(a.get("gpu_uuid")), used_mib=_int(a.get("used_mib")),
                   name=_str(a.get("name")))


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML could be used (`available` None: not asked)."""

    available: bool | None
    error: str | None


@dataclass(frozen=True)
class SmiStatus:
    """Where nvidia-smi was found (None: not on PATH) and what failed."""

    path: str | None
    error: str | None
    apps_error: str | None = None


@fact
@dataclass(frozen=True)
class GpuHealth:
    """GPUs, driver and compute processes, through NVML else nvidia-smi (`source`; None: no
    GPU could be listed, `error` says why). host_health and sglang_server read GPUs here."""

    probe: ClassVar[str] = "gpu_facts"

    source: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    count: int
    devices: tuple[GpuBoard, ...]
    processes: tuple[GpuUser, ...]
    error: str | None
    nvml: NvmlStatus | None
    nvidia_smi: SmiStatus | None

    @classmethod
    def from_answer(cls, answer: Any) -> GpuHealth:
        """Parse gpu_facts' dict."""
        a = _d(answer)
        nv, sm = a.get("nvml"), a.get("nvidia_smi")
        return cls(
            source=_str(a.get("source")), driver_version=_str(a.get("driver_version")),
            cuda_driver_version=_str(a.get("cuda_driver_version")),
            count=_int(a.get("count")) or 0,
            devices=tuple(GpuBoard.from_answer(d) for d in _l(a.get("devices"))),
            processes=tuple(GpuUser.from_answer(p) for p in _l(a.get("processes"))
                            if _int(_d(p).get("pid")) is not None),
            error=_str(a.get("error")),
            nvml=None if not isinstance(nv, dict) else NvmlStatus(
                _bool(nv.get("available")), _str(nv.get("error"))),
            nvidia_smi=None if not isinstance(sm, dict) else SmiStatus(
                _str(sm.get("path")), _str(sm.get("error")), _str(sm.get("apps_error"))))


# ------------------------------------------------------------------------------ uvm_facts


@dataclass(frozen=True)
class DeviceNode:
    """A /dev node: present (None: could not stat), char device, major:minor."""

    path: str | None
    present: bool | None
    char_device: bool | None
    major: int | None
    minor: int | None
    error: str | None = None


@dataclass(frozen=True)
class DeviceRule:
    """One cgroup v1 devices.list rule; major/minor are ints or "*"."""

    type: str
    major: int | str
    minor: int | str
    access: str


@dataclass(frozen=True)
class DeviceCgroup:
    """The device cgroup: v1 rules (v2 has no readable list), and whether they allow uvm."""

    version: int | None
    devices_list: str | None
    rules: tuple[DeviceRule, ...] | None
    allows_uvm: bool | None


@dataclass(frozen=True)
class OpenResult:
    """open(path, O_RDWR): ok, or the errno name ("EPERM", "ENOENT", ...) and its text."""

    ok: bool
    errno: str | None
    error: str | None


@dataclass(frozen=True)
class CudaInit:
    """cuInit(0) in a child process: its code (None: not testable) and name."""

    code: int | None
    name: str | None
    source: str | None
    error: str | None
    devices: int | None = None
    driver_version_int: int | None = None


def _rule(r: Any) -> DeviceRule:
    r = _d(r)
    major, minor = r.get("major"), r.get("minor")
    return DeviceRule(type=str(r.get("type")), major=major if _int(major) is not None else "*",
                      minor=minor if _int(minor) is not None else "*",
                      access=str(r.get("access") or ""))


def _cuda(c: Any) -> CudaInit | None:
    if not isinstance(c, dict):
        return None
    return CudaInit(code=_int(c.get("code")), name=_str(c.get("name")),
                    source=_str(c.get("source")), error=_str(c.get("error")),
                    devices=_int(c.get("devices")),
                    driver_version_int=_int(c.get("driver_version_int")))


@fact
@dataclass(frozen=True)
class UvmFacts:
    """/dev/nvidia-uvm: the kernel's major (/proc/devices, not namespaced), the node, the
    device cgroup, open(O_RDWR), and cuInit(0) (None when not asked)."""

    probe: ClassVar[str] = "uvm_facts"

    proc_devices_error: str | None
    char_devices: tuple[tuple[int, str], ...]
    proc_major: int | None
    node: DeviceNode
    major_match: bool | None
    cgroup: DeviceCgroup
    open: OpenResult
    cuda_init: CudaInit | None

    @classmethod
    def from_answer(cls, answer: Any) -> UvmFacts:
        """Parse uvm_facts' dict (char_devices keys are strings in JSON)."""
        a = _d(answer)
        node, cg, op = _d(a.get("node")), _d(a.get("cgroup")), _d(a.get("open"))
        rules = cg.get("rules")
        return cls(
            proc_devices_error=_str(a.get("proc_devices_error")),
            char_devices=tuple(sorted((int(k), str(v)) for k, v in
                                      _d(a.get("char_devices")).items() if str(k).isdigit())),
            proc_major=_int(a.get("proc_major")),
            node=DeviceNode(path=_str(node.get("path")), present=_bool(node.get("present")),
                            char_device=_bool(node.get("char_device")),
                            major=_int(node.get("major")), minor=_int(node.get("minor")),
                            error=_str(node.get("error"))),
            major_match=_bool(a.get("major_match")),
            cgroup=DeviceCgroup(
                version=_int(cg.get("version")), devices_list=_str(cg.get("devices_list")),
                rules=None if not isinstance(rules, list) else tuple(_rule(r) for r in rules),
                allows_uvm=_bool(cg.get("allows_uvm"))),
            open=OpenResult(ok=op.get("ok") is True, errno=_str(op.get("errno")),
                            error=_str(op.get("error"))),
            cuda_init=_cuda(a.get("cuda_init")))

    @property
    def registered(self) -> dict[int, str]:
        """The char majors a driver registers now ({major: name})."""
        return dict(self.char_devices)


# ------------------------------------------------------------------------------ shm, xid, disk


@fact
@dataclass(frozen=True)
class ShmFacts:
    """/dev/shm: size and free bytes (None when it could not be read)."""

    probe: ClassVar[str] = "shm_facts"

    path: str | None
    exists: bool
    size: int | None
    free: int | None
    error: str | None

    @classmethod
    def from_answer(cls, answer: Any) -> ShmFacts:
        """Parse shm_facts' dict."""
        a = _d(answer)
        return cls(path=_str(a.get("path")), exists=a.get("exists") is True,
                   size=_int(a.get("size")), free=_int(a.get("free")), error=_str(a.get("error")))


@dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid (PCI:...): CODE, detail` kernel log line."""

    code: int | None
    pci: str | None
    detail: str | None
    line: str
    source: str | None


@fact
@dataclass(frozen=True)
class KernelXid:
    """The last NVIDIA Xid messages of kern.log and dmesg, and which sources could be read."""

    probe: ClassVar[str] = "kernel_xid"

    events: tuple[XidEvent, ...]
    codes: tuple[int, ...]
    sources: tuple[tuple[str, str], ...]

    @classmethod
    def from_answer(cls, answer: Any) -> KernelXid:
        """Parse kernel_xid's dict."""
        a = _d(answer)
        events = tuple(XidEvent(code=_int(e.get("code")), pci=_str(e.get("pci")),
                                detail=_str(e.get("detail")), line=str(e.get("line") or ""),
                                source=_str(e.get("source")))
                       for e in map(_d, _l(a.get("events"))))
        return cls(events=events,
                   codes=tuple(c for c in map(_int, _l(a.get("codes"))) if c is not None),
                   sources=tuple((str(k), str(v)) for k, v in _d(a.get("sources")).items()))

    def lines_with(self, code: int) -> tuple[str, ...]:
        """The log lines of the events with this Xid code, oldest first."""
        return tuple(e.line for e in self.events if e.code == code)


@fact
@dataclass(frozen=True)
class DiskFree:
    """The filesystem holding `path` (its nearest existing parent, `checked_path`)."""

    probe: ClassVar[str] = "disk_free"

    path: str | None
    checked_path: str | None
    free: int
    total: int | None
    free_inodes: int | None

    @classmethod
    def from_answer(cls, answer: Any) -> DiskFree:
        """Parse disk_free's dict."""
        a = _d(answer)
        return cls(path=_str(a.get("path")), checked_path=_str(a.get("checked_path")),
                   free=_int(a.get("free")) or 0, total=_int(a.get("total")),
                   free_inodes=_int(a.get("free_inodes")))


@fact
@dataclass(frozen=True)
class DirUsage:
    """Bytes already stored under a directory (0 when it is absent)."""

    probe: ClassVar[str] = "dir_usage"

    path: str | None
    exists: bool
    bytes: int
    files: int
    complete: bool

    @classmethod
    def from_answer(cls, answer: Any) -> DirUsage:
        """Parse dir_usage's dict."""
        a = _d(answer)
        return cls(path=_str(a.get("path")), exists=a.get("exists") is True,
                   bytes=_int(a.get("bytes")) or 0, files=_int(a.get("files")) or 0,
                   complete=a.get("complete") is not False)
