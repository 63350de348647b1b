"""Hardware profiles and the initial state of a simulated box (GPU container + its hypervisor).

The state file format is owned by :mod:`orchestrator_sim.hostenv.site.simhw` (the host side reads
it); this module builds a fresh one and re-rolls what changes at a reboot.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid as _uuid
from dataclasses import dataclass, field

#: uvm majors seen in the field (FACTS.md): 507-511, 234-243 on old kernels
UVM_MAJORS = tuple(range(507, 512)) + tuple(range(234, 244))


@dataclass(frozen=True)
class Profile:
    """A GPU box model: what `nvidia-smi` and NVML report."""

    name: str
    gpu_name: str
    gpu_count: int
    memory_total_mib: int
    compute_capability: tuple[int, int]
    driver_version: str
    cuda_version: str
    pcie_gen: int = 5
    pcie_width: int = 16
    power_limit_w: int = 600
    pci_buses: tuple[str, ...] = field(default=("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"))


PROFILES: dict[str, Profile] = {
    "rtx-pro-6000x8": Profile(
        name="rtx-pro-6000x8",
        gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        gpu_count=8,
        memory_total_mib=97887,
        compute_capability=(12, 0),
        driver_version="580.95.05",
        cuda_version="13.0",
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown hardware profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}"
        ) from None


def _rng(*seed: object) -> random.Random:
    digest = hashlib.sha256("|".join(str(s) for s in seed).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def gpu_uuid(seed: str, index: int) -> str:
    digest = hashlib.sha256(f"{seed}:gpu:{index}".encode()).digest()
    return "GPU-" + str(_uuid.UUID(bytes=digest[:16], version=4))


def pick_uvm_major(seed: str, boot: int, avoid: int | None = None) -> int:
    rng = _rng(seed, "uvm", boot)
    choices = [m for m in UVM_MAJORS if m != avoid]
    return rng.choice(choices)


def boot_lines(major: int, driver: str, uvm_loaded: bool = True) -> list[str]:
    lines = [
        "Linux version 6.8.12-11-pve (build@proxmox) (gcc (Debian 12.2.0-14+deb12u1) 12.2.0) "
        "#1 SMP PREEMPT_DYNAMIC PMX 6.8.12-11",
        "nvidia: loading out-of-tree module taints kernel.",
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 510",
        f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  "
        "(dvs-builder@U22-I3-AM02-24-3)  Wed Sep 24 23:41:08 UTC 2025",
    ]
    if uvm_loaded:
        lines.append(f"nvidia-uvm: Loaded the UVM driver, major device number {major}.")
    return lines


def new_state(
    *,
    seed: str,
    box: str,
    profile: Profile,
    roots: dict[str, str],
    hypervisor: str | None,
    ctid: int | None,
    time_scale: float,
    load_seconds: float,
    conf_rules: list[str] | None,
) -> dict:
    """A freshly booted box; `conf_rules` is the container's device cgroup (None = bare host)."""
    major = pick_uvm_major(seed, 0)
    gpus = []
    for i in range(profile.gpu_count):
        bus = profile.pci_buses[i % len(profile.pci_buses)]
        gpus.append({
            "name": profile.gpu_name,
            "uuid": gpu_uuid(seed, i),
            "pci_bus_id": f"0000:{bus}:00.0",
            "memory_total_mib": profile.memory_total_mib,
            "base_used_mib": 0,
            "compute_capability": list(profile.compute_capability),
            "pcie_gen": profile.pcie_gen,
            "pcie_gen_max": profile.pcie_gen,
            "pcie_width": profile.pcie_width,
            "pcie_width_max": profile.pcie_width,
            "persistence_mode": True,
            "ecc_uncorrected": 0,
            "ecc_corrected": 0,
            "temperature_c": 30 + i % 4,
            "power_draw_w": 35 + i % 3,
            "power_limit_w": profile.power_limit_w,
            "lost": False,
        })
    now = time.time()
    return {
        "version": 1,
        "seed": seed,
        "box": box,
        "hypervisor": hypervisor,
        "ctid": ctid,
        "roots": roots,
        "profile": profile.name,
        "gpus": gpus,
        "driver": {"version": profile.driver_version, "cuda": profile.cuda_version,
                   "loaded": True},
        "kernel": {"uvm_major": major, "uvm_loaded": True, "host_node_major": major,
                   "boot_id": str(_uuid.uuid4()), "booted_at": now, "boot_offset": 4.0,
                   "boots": 0},
        "container": {"running": True, "node_major": major, "cgroup_version": 2,
                      "allow": None if conf_rules is None else list(conf_rules)},
        "faults": {},
        "allocations": {},
        "kmsg": [[round(1.0 + 0.4 * n, 6), line]
                 for n, line in enumerate(boot_lines(major, profile.driver_version))],
        "shm_mib": 131072,
        "disk_gib": 3840,  # the box's model disk (a 3.84 TB NVMe); statvfs reports this size
        "time_scale": time_scale,
        "load_seconds": load_seconds,
        "nvml_absent": False,
    }


def reboot_kernel(state: dict) -> int:
    """Re-roll the uvm major (always a different one), new boot id, fresh ring buffer."""
    kernel = state["kernel"]
    old = int(kernel["uvm_major"])
    boots = int(kernel.get("boots", 0)) + 1
    new = pick_uvm_major(state["seed"], boots, avoid=old)
    loaded = "uvm-node-missing" not in state.get("faults", {})
    kernel.update({"uvm_major": new, "uvm_loaded": loaded,
                   "host_node_major": new if loaded else None,
                   "boot_id": str(_uuid.uuid4()), "booted_at": time.time(), "boots": boots})
    state["allocations"] = {}
    state["kmsg"] = [[round(1.0 + 0.4 * n, 6), line]
                     for n, line in enumerate(boot_lines(new, state["driver"]["version"],
                                                         loaded))]
    return new
