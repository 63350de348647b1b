"""The simulated GPU hardware of one box, as seen from a process running on a simulated host.

Stdlib-only, Python 3.8+. The box's state is one JSON file (path in the environment variable
``SIM_HOST_STATE``) shared by the GPU container host and its hypervisor; every change goes through
:func:`update`, which holds an exclusive ``flock`` on ``<state>.lock`` and writes atomically.
Allocations whose process is gone are garbage-collected on every read.

API used by the SGLang stand-in (kept stable)::

    cuda_init() -> int          0 ok; 999 uvm unusable; 100 no GPU / no driver; 35 driver too old
    device_count() -> int
    gpu_info() -> list[dict]    index, name, memory_total_mib, memory_used_mib, uuid,
                                compute_capability [12, 0], pci_bus_id
    allocate(pid, mib, gpus)    raises OutOfMemory when a GPU lacks free memory (mib per GPU)
    release(pid)
    time_scale() -> float; load_seconds() -> float

Indices are those of the GPUs present (a GPU that fell off the bus disappears and the rest
renumber, as in nvidia-smi). CUDA_VISIBLE_DEVICES is NOT applied here.
"""

# ruff: noqa: UP031  (host-side code keeps printf-style formatting for its tables)

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time

CUDA_SUCCESS = 0
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_UNKNOWN = 999

NVIDIA_MAJOR = 195
NVIDIA_CAPS_MAJOR = 506
#: minimum driver for sm_120 (CUDA 12.8)
MIN_DRIVER_SM120 = (570, 26)

ROLE_CONTAINER = "container"
ROLE_HYPERVISOR = "hypervisor"
ROLE_BARE = "bare"


class SimHWError(Exception):
    """The simulated host is not set up (no SIM_HOST_STATE) or its state is unreadable."""


class OutOfMemory(Exception):
    """A GPU lacks the free memory an allocation asked for."""


# --------------------------------------------------------------------------- state file I/O


def state_path() -> str:
    path = os.environ.get("SIM_HOST_STATE")
    if not path:
        raise SimHWError(
            "SIM_HOST_STATE is not set: this process does not run on a simulated host "
            "(run it through the simulator's SSH endpoint)"
        )
    return path


def role() -> str:
    return os.environ.get("SIM_HOST_ROLE", ROLE_CONTAINER)


def host_root() -> str:
    return os.environ.get("SIM_HOST_ROOT", "")


def _pid_alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return False
    # state letter follows the ")" closing the command name
    tail = data.rsplit(b")", 1)[-1].split()
    return bool(tail) and tail[0] not in (b"Z", b"X")


def gc_allocations(state: dict) -> bool:
    """Drop the GPU memory of processes that ended from STATE (the driver frees it)."""
    allocs = state.get("allocations") or {}
    dead = [p for p in allocs if not _pid_alive(int(p))]
    for p in dead:
        del allocs[p]
    return bool(dead)


def read_state(path: str | None = None) -> dict:
    path = path or state_path()
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        msg = "simulated host state %s is missing (is the simulator up?)" % path
        raise SimHWError(msg) from None
    except ValueError as exc:
        raise SimHWError("simulated host state %s is corrupt: %s" % (path, exc)) from None
    gc_allocations(state)
    return state


def write_state(state: dict, path: str | None = None) -> None:
    """Write atomically (temp + fsync + rename). Callers hold the lock (see `update`).

    The kernel ring buffer is written beside it as text (`kmsg_path`), for the simulated
    `dmesg`: a shell `cat` of it, as cheap as the real dmesg (a C program) where a Python one
    cost every host check ~25 ms of CPU."""
    path = path or state_path()
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    ring = kmsg_path(path)
    with open(ring + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in kernel_messages(state)))
    os.replace(ring + ".tmp", ring)
    os.replace(tmp, path)


def kmsg_path(path: str | None = None) -> str:
    """The ring buffer's text beside the state file STATE_DIR/kmsg (what `dmesg` prints)."""
    return os.path.join(os.path.dirname(path or state_path()), "kmsg")


@contextlib.contextmanager
def locked(path: str | None = None):
    """Hold the state's exclusive lock; yield the (GC'd) state; write it back on success."""
    path = path or state_path()
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        state = read_state(path)
        yield state
        write_state(state, path)
    finally:
        os.close(fd)


def update(fn, path: str | None = None):
    """Apply fn(state) under the lock and persist; return fn's result."""
    with locked(path) as state:
        return fn(state)


# --------------------------------------------------------------------------- derived facts


def _present(state: dict) -> list:
    return [g for g in state.get("gpus", []) if not g.get("lost")]


def _driver_tuple(version: str) -> tuple:
    parts = []
    for p in version.split(".")[:2]:
        try:
            parts.append(int(p))
        except ValueError:
            parts.append(0)
    return tuple(parts)


def _cuda_int(text: str) -> int:
    major, _, minor = text.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def allow_rules(state: dict, who: str | None = None) -> list | None:
    """Device-cgroup rules of `who` (a role); None means everything is allowed."""
    who = who or role()
    if who == ROLE_HYPERVISOR:
        return None
    return state.get("container", {}).get("allow")


def device_allowed(rules: list | None, major: int, minor: int | None = None) -> bool:
    """Would a device cgroup with these rules let a process open (rw) device major:minor?"""
    if rules is None:
        return True
    for rule in rules:
        parts = rule.split()
        if not parts:
            continue
        if parts[0] == "a":
            return True
        if parts[0] != "c" or len(parts) < 2:
            continue
        access = parts[2] if len(parts) > 2 else "rwm"
        if "r" not in access or "w" not in access:
            continue
        rmaj, _, rmin = parts[1].partition(":")
        if rmaj not in ("*", str(major)):
            continue
        if rmin in ("", "*") or minor is None or rmin == str(minor):
            return True
    return False


def uvm_node_major(state: dict, who: str | None = None) -> int | None:
    """Major of /dev/nvidia-uvm as this role sees it; None when the node is missing."""
    who = who or role()
    kernel = state.get("kernel", {})
    if who == ROLE_CONTAINER:
        return state.get("container", {}).get("node_major")
    return kernel.get("host_node_major")


def uvm_status(state: dict | None = None, who: str | None = None) -> dict:
    state = state if state is not None else read_state()
    who = who or role()
    kernel = state.get("kernel", {})
    node = uvm_node_major(state, who)
    rules = allow_rules(state, who)
    return {
        "kernel_major": kernel.get("uvm_major") if kernel.get("uvm_loaded", True) else None,
        "node_major": node,
        "allowed": None if node is None else device_allowed(rules, node, 0),
        "cgroup_rules": rules,
        "cgroup_version": state.get("container", {}).get("cgroup_version", 2),
    }


def device_nodes(state: dict, who: str | None = None) -> dict:
    """path -> (major, minor) of the NVIDIA device nodes this role sees."""
    who = who or role()
    nodes = {"/dev/nvidiactl": (NVIDIA_MAJOR, 255), "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254)}
    for i in range(len(state.get("gpus", []))):
        nodes["/dev/nvidia%d" % i] = (NVIDIA_MAJOR, i)
    umaj = uvm_node_major(state, who)
    if umaj is not None:
        nodes["/dev/nvidia-uvm"] = (umaj, 0)
        nodes["/dev/nvidia-uvm-tools"] = (umaj, 1)
    return nodes


def open_errno(state: dict, path: str, who: str | None = None) -> int | None:
    """The errno an open(O_RDWR) of a device node fails with, or None when it would work."""
    who = who or role()
    nodes = device_nodes(state, who)
    if path not in nodes:
        return errno.ENOENT
    major, minor = nodes[path]
    if not device_allowed(allow_rules(state, who), major, minor):
        return errno.EPERM
    kernel = state.get("kernel", {})
    if major == NVIDIA_MAJOR:
        if not state.get("driver", {}).get("loaded", True):
            return errno.ENXIO
        return None
    if not kernel.get("uvm_loaded", True) or major != kernel.get("uvm_major"):
        return errno.ENXIO
    return None


def proc_devices_text(state: dict | None = None) -> str:
    state = state if state is not None else read_state()
    kernel = state.get("kernel", {})
    chars = [
        (1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (4, "ttyS"), (5, "/dev/tty"),
        (5, "/dev/console"), (5, "/dev/ptmx"), (7, "vcs"), (10, "misc"), (13, "input"),
        (29, "fb"), (89, "i2c"), (128, "ptm"), (136, "pts"), (180, "usb"),
        (188, "ttyUSB"), (189, "usb_device"), (202, "cpu/msr"), (203, "cpu/cpuid"),
        (226, "drm"), (245, "hidraw"), (246, "usbmon"), (247, "bsg"), (248, "watchdog"),
        (249, "ptp"), (250, "pps"), (251, "rtc"), (252, "dax"), (253, "tpm"),
        (254, "gpiochip"),
    ]
    if state.get("driver", {}).get("loaded", True):
        chars.append((NVIDIA_MAJOR, "nvidia-frontend"))
        chars.append((NVIDIA_CAPS_MAJOR, "nvidia-caps"))
        if kernel.get("uvm_loaded", True) and kernel.get("uvm_major"):
            chars.append((int(kernel["uvm_major"]), "nvidia-uvm"))
    chars.sort(key=lambda c: c[0])
    blocks = [(7, "loop"), (8, "sd"), (9, "md"), (11, "sr"), (65, "sd"), (253, "device-mapper"),
              (254, "mdp"), (259, "blkext")]
    lines = ["Character devices:"] + ["%3d %s" % c for c in chars]
    lines += ["", "Block devices:"] + ["%3d %s" % b for b in blocks]
    return "\n".join(lines) + "\n"


def devices_list_text(state: dict | None = None) -> str | None:
    """cgroup v1 devices.list of this host's cgroup; None under cgroup v2 (no such file)."""
    state = state if state is not None else read_state()
    if state.get("container", {}).get("cgroup_version", 2) != 1:
        return None
    rules = allow_rules(state)
    if rules is None:
        return "a *:* rwm\n"
    return "".join(r.strip() + "\n" for r in rules)


def driver_version_text(state: dict | None = None) -> str | None:
    """/proc/driver/nvidia/version content, None when the driver is not loaded."""
    state = state if state is not None else read_state()
    drv = state.get("driver", {})
    if not drv.get("loaded", True):
        return None
    return (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  "
        "(dvs-builder@U22-I3-AM02-24-3)  Wed Sep 24 23:41:08 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n" % drv.get("version")
    )


# --------------------------------------------------------------------------- public hardware API


def time_scale() -> float:
    return float(read_state().get("time_scale", 1.0))


def load_seconds() -> float:
    return float(read_state().get("load_seconds", 960.0))


def driver_version() -> str:
    return str(read_state().get("driver", {}).get("version", ""))


def cuda_version() -> str:
    return str(read_state().get("driver", {}).get("cuda", ""))


def cuda_driver_version_int() -> int:
    return _cuda_int(cuda_version())


def nvml_error(state: dict | None = None) -> int | None:
    """NVML return code that nvmlInit would fail with (None = works). 12 lib absent, 9 no
    driver, 999 unknown (device cgroup denies /dev/nvidiactl, the usual LXC symptom)."""
    state = state if state is not None else read_state()
    if state.get("nvml_absent"):
        return 12
    return smi_error(state)


def smi_error(state: dict | None = None) -> int | None:
    """Why nvidia-smi cannot talk to the driver: 9 no driver, 999 unknown; None = fine."""
    state = state if state is not None else read_state()
    if not state.get("driver", {}).get("loaded", True):
        return 9
    if not device_allowed(allow_rules(state), NVIDIA_MAJOR, 255):
        return 999
    return None


def cuda_init() -> int:
    """What cuInit(0) would return on this host now."""
    state = read_state()
    drv = state.get("driver", {})
    if not drv.get("loaded", True):
        return CUDA_ERROR_NO_DEVICE
    if _driver_tuple(str(drv.get("version", "0"))) < MIN_DRIVER_SM120:
        return CUDA_ERROR_INSUFFICIENT_DRIVER
    if not device_allowed(allow_rules(state), NVIDIA_MAJOR, 255):
        return CUDA_ERROR_UNKNOWN
    if not _present(state):
        return CUDA_ERROR_NO_DEVICE
    if open_errno(state, "/dev/nvidia-uvm") is not None:
        return CUDA_ERROR_UNKNOWN
    return CUDA_SUCCESS


def device_count() -> int:
    state = read_state()
    if not state.get("driver", {}).get("loaded", True):
        return 0
    return len(_present(state))


def _used_by_gpu(state: dict) -> dict:
    used = {}
    for alloc in (state.get("allocations") or {}).values():
        for idx, mib in (alloc.get("gpus") or {}).items():
            used[idx] = used.get(idx, 0) + int(mib)
    return used


def gpu_info(state: dict | None = None) -> list:
    state = state if state is not None else read_state()
    used = _used_by_gpu(state)
    out = []
    for i, g in enumerate(_present(state)):
        u = int(g.get("base_used_mib", 0)) + used.get(g["uuid"], 0)
        out.append({
            "index": i,
            "name": g["name"],
            "memory_total_mib": int(g["memory_total_mib"]),
            "memory_used_mib": u,
            "memory_free_mib": max(0, int(g["memory_total_mib"]) - u),
            "uuid": g["uuid"],
            "compute_capability": list(g["compute_capability"]),
            "pci_bus_id": g["pci_bus_id"],
            "pcie_gen": int(g.get("pcie_gen", 5)),
            "pcie_gen_max": int(g.get("pcie_gen_max", g.get("pcie_gen", 5))),
            "pcie_width": int(g.get("pcie_width", 16)),
            "pcie_width_max": int(g.get("pcie_width_max", g.get("pcie_width", 16))),
            "persistence_mode": bool(g.get("persistence_mode", True)),
            "ecc_uncorrected": int(g.get("ecc_uncorrected", 0)),
            "ecc_corrected": int(g.get("ecc_corrected", 0)),
            "temperature_c": int(g.get("temperature_c", 31)),
            "power_draw_w": int(g.get("power_draw_w", 36)),
            "power_limit_w": int(g.get("power_limit_w", 600)),
            "utilization_pct": 0 if u == 0 else 3,
        })
    return out


def _process_name(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return ""
    return argv[0].decode("utf-8", "replace") if argv else ""


def allocate(pid: int, mib: int, gpus) -> None:
    """Reserve `mib` MiB on each listed GPU (present-GPU indices) for process `pid`."""
    pid = int(pid)
    mib = int(mib)
    if mib < 0:
        raise ValueError("mib must be >= 0")
    gpus = [int(i) for i in gpus]

    def apply(state: dict) -> None:
        present = _present(state)
        used = _used_by_gpu(state)
        for i in gpus:
            if i < 0 or i >= len(present):
                raise ValueError("invalid device ordinal %d (%d GPUs present)" % (i, len(present)))
            g = present[i]
            free = int(g["memory_total_mib"]) - int(g.get("base_used_mib", 0)) - used.get(
                g["uuid"], 0)
            if mib > free:
                raise OutOfMemory(
                    "CUDA out of memory. Tried to allocate %d MiB. GPU %d has a total capacity of "
                    "%d MiB of which %d MiB is free." % (mib, i, int(g["memory_total_mib"]), free)
                )
        allocs = state.setdefault("allocations", {})
        entry = allocs.setdefault(str(pid), {"name": _process_name(pid), "gpus": {}})
        for i in gpus:
            uuid = present[i]["uuid"]
            entry["gpus"][uuid] = int(entry["gpus"].get(uuid, 0)) + mib

    update(apply)


def release(pid: int) -> None:
    def apply(state: dict) -> None:
        (state.get("allocations") or {}).pop(str(int(pid)), None)

    update(apply)


def processes(state: dict | None = None) -> list:
    """Compute processes holding GPU memory: pid (host pid), name, gpu index/uuid, used MiB."""
    state = state if state is not None else read_state()
    index = {g["uuid"]: i for i, g in enumerate(_present(state))}
    out = []
    for pid, alloc in sorted((state.get("allocations") or {}).items(), key=lambda kv: int(kv[0])):
        for uuid, mib in sorted(alloc.get("gpus", {}).items()):
            if uuid in index:
                out.append({"pid": int(pid), "name": alloc.get("name") or _process_name(int(pid)),
                            "gpu_index": index[uuid], "gpu_uuid": uuid, "used_mib": int(mib)})
    out.sort(key=lambda p: (p["gpu_index"], p["pid"]))
    return out


def kernel_messages(state: dict | None = None) -> list:
    """dmesg-style lines: "[  12.345678] text"."""
    state = state if state is not None else read_state()
    return ["[%12.6f] %s" % (float(t), msg) for t, msg in state.get("kmsg", [])]


def log_kernel(state: dict, text: str) -> None:
    """Append a kernel message to `state` (caller persists) and to each host's kern.log."""
    kernel = state.setdefault("kernel", {})
    since = max(0.0, time.time() - float(kernel.get("booted_at", time.time())))
    since += float(kernel.get("boot_offset", 4.0))
    state.setdefault("kmsg", []).append([round(since, 6), text])
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime())
    for name, root in sorted((state.get("roots") or {}).items()):
        log_dir = os.path.join(root, "var", "log")
        try:
            os.makedirs(log_dir, exist_ok=True)
            with open(os.path.join(log_dir, "kern.log"), "a", encoding="utf-8") as f:
                f.write("%s %s kernel: [%12.6f] %s\n" % (stamp, name, since, text))
        except OSError:
            pass


def fault(name: str, state: dict | None = None) -> dict | None:
    state = state if state is not None else read_state()
    return (state.get("faults") or {}).get(name)


def disk_gib(state: dict | None = None) -> int:
    """Size of the box's disk as statvfs reports it (the real one under it is smaller)."""
    state = state if state is not None else read_state()
    return int(state.get("disk_gib", 3840))


def shm_mib(state: dict | None = None) -> int:
    state = state if state is not None else read_state()
    f = fault("shm-small", state)
    if f is not None:
        return int(f.get("shm_mib", 64))
    return int(state.get("shm_mib", 131072))


def boot_id(state: dict | None = None) -> str:
    state = state if state is not None else read_state()
    return str(state.get("kernel", {}).get("boot_id", ""))
