"""GPU host probes, run ON the host by the agent (stdlib only, Python 3.8+).

    gpu_facts   GPUs, driver, CUDA driver version, memory, ECC, PCIe, compute processes:
                through NVML (`import pynvml`), else `nvidia-smi --query-... --format=csv`
    uvm_facts   /dev/nvidia-uvm: the kernel's major (/proc/devices), the node's major, the
                device cgroup (v1 devices.list; v2 has no readable file), whether open(O_RDWR)
                is permitted, and what cuInit(0) returns (in a child process)
    shm_facts   size of /dev/shm (statvfs)
    kernel_xid  the last `NVRM: Xid` lines of /var/log/kern.log and dmesg, with their codes
    dir_usage   bytes already stored under a directory (counts toward a disk budget)

Every probe reads REAL paths with plain open()/os.stat, and never raises for a missing tool or
file: what it could not learn is reported in the result (`error` fields), so the stage can say
what is wrong. The parse_* functions are pure and tested against recorded outputs.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys
import threading

from orchestrator.remote.probes import module_source, probe

MIB = 1024 * 1024
NVIDIA_MAJOR = 195

#: CUDA driver API result codes worth naming (cuda.h)
CUDA_ERRORS = {
    0: "CUDA_SUCCESS",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    46: "CUDA_ERROR_DEVICES_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

#: nvidia-smi --query-gpu fields, in the order gpu_facts asks for them
SMI_GPU_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used", "driver_version",
    "compute_cap", "ecc.errors.uncorrected.volatile.total", "persistence_mode",
    "pcie.link.gen.current", "pcie.link.width.current",
)
#: nvidia-smi --query-compute-apps fields (process_name last: it is the only one with spaces)
SMI_APP_FIELDS = ("pid", "gpu_uuid", "used_gpu_memory", "process_name")

_SMI_BAD_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_SMI_CUDA = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)?)")
_XID = re.compile(r"NVRM: Xid \(([^)]*)\):\s*(\d+)(.*)$")


# ---------------------------------------------------------------------------- pure parsers


def parse_proc_devices(text: str) -> dict:
    """{"char": {major: name}, "block": {major: name}} from /proc/devices text."""
    out = {"char": {}, "block": {}}  # type: dict
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.lower().startswith("character devices"):
            section = "char"
            continue
        if line.lower().startswith("block devices"):
            section = "block"
            continue
        parts = line.split(None, 1)
        if section is None or len(parts) != 2 or not parts[0].isdigit():
            continue
        out[section].setdefault(int(parts[0]), parts[1].strip())
    return out


def uvm_major_from_proc_devices(text: str) -> int | None:
    """The major of the `nvidia-uvm` character device, None when the module is not loaded."""
    for major, name in sorted(parse_proc_devices(text)["char"].items()):
        if name == "nvidia-uvm":
            return major
    return None


def parse_devices_list(text: str) -> list:
    """cgroup v1 devices.list rules: [{"type": "c"|"b"|"a", "major", "minor", "access"}].

    `major`/`minor` are ints or "*" for a wildcard.
    """
    rules = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        kind = parts[0]
        if kind not in ("a", "b", "c"):
            continue
        major, minor = "*", "*"  # type: object, object
        if len(parts) > 1 and ":" in parts[1]:
            a, _, b = parts[1].partition(":")
            major = int(a) if a.isdigit() else "*"
            minor = int(b) if b.isdigit() else "*"
        access = parts[2] if len(parts) > 2 else "rwm"
        rules.append({"type": kind, "major": major, "minor": minor, "access": access})
    return rules


def devices_allow(rules: list, major: int, minor: int = 0, access: str = "rw") -> bool:
    """Would these cgroup v1 rules let a process open char device major:minor with `access`?"""
    for rule in rules:
        if not all(c in rule["access"] for c in access):
            continue
        if rule["type"] == "a":
            return True
        if rule["type"] != "c":
            continue
        if rule["major"] not in ("*", major):
            continue
        if rule["minor"] in ("*", minor):
            return True
    return False


def _smi_value(value: str):
    v = value.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "NOT SUPPORTED"):
        return None
    return v


def _smi_int(value: str):
    v = _smi_value(value)
    if v is None:
        return None
    try:
        return int(float(v))
    except ValueError:
        return None


def parse_smi_csv(text: str, fields) -> list:
    """Rows of `nvidia-smi --query-*=FIELDS --format=csv,noheader,nounits` as dicts.

    The last field may contain ", " (process names); the others never do.
    """
    fields = list(fields)
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(", ", len(fields) - 1)]
        if len(values) != len(fields):
            continue
        rows.append(dict(zip(fields, values)))  # noqa: B905  (3.8: no strict=)
    return rows


def smi_gpu_rows(text: str, fields=SMI_GPU_FIELDS) -> list:
    """Device dicts (the gpu_facts shape) from a --query-gpu csv answer."""
    devices = []
    for row in parse_smi_csv(text, fields):
        pm = _smi_value(row.get("persistence_mode", ""))
        devices.append({
            "index": _smi_int(row.get("index", "")),
            "name": _smi_value(row.get("name", "")),
            "uuid": _smi_value(row.get("uuid", "")),
            "pci_bus_id": _smi_value(row.get("pci.bus_id", "")),
            "memory_total_mib": _smi_int(row.get("memory.total", "")),
            "memory_used_mib": _smi_int(row.get("memory.used", "")),
            "compute_capability": _smi_value(row.get("compute_cap", "")),
            "ecc_uncorrected": _smi_int(row.get("ecc.errors.uncorrected.volatile.total", "")),
            "persistence_mode": None if pm is None else pm.lower() == "enabled",
            "pcie_gen": _smi_int(row.get("pcie.link.gen.current", "")),
            "pcie_width": _smi_int(row.get("pcie.link.width.current", "")),
            "driver_version": _smi_value(row.get("driver_version", "")),
        })
    return devices


def smi_app_rows(text: str, fields=SMI_APP_FIELDS) -> list:
    """Process dicts from a --query-compute-apps csv answer (pids are HOST pids)."""
    procs = []
    for row in parse_smi_csv(text, fields):
        pid = _smi_int(row.get("pid", ""))
        if pid is None:
            continue
        procs.append({
            "pid": pid,
            "gpu_uuid": _smi_value(row.get("gpu_uuid", "")),
            "used_mib": _smi_int(row.get("used_gpu_memory", "")),
            "name": _smi_value(row.get("process_name", "")),
        })
    return procs


def smi_cuda_version(text: str) -> str | None:
    """"13.0" from the banner of plain `nvidia-smi` (or `nvidia-smi -q`)."""
    m = _SMI_CUDA.search(text)
    return m.group(1) if m else None


def smi_bad_field(text: str) -> str | None:
    """The field an older nvidia-smi refused ('Field "X" is not a valid field to query')."""
    m = _SMI_BAD_FIELD.search(text)
    return m.group(1) if m else None


def cuda_version_str(value) -> str | None:
    """12080 -> "12.8" (the int that cuDriverGetVersion / NVML report)."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    if v <= 0:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def parse_xid_lines(text: str) -> list:
    """`NVRM: Xid (PCI:...): CODE, ...` lines -> [{"code", "pci", "detail", "line"}]."""
    out = []
    for raw in text.splitlines():
        m = _XID.search(raw)
        if not m:
            continue
        out.append({
            "code": int(m.group(2)),
            "pci": m.group(1).replace("PCI:", "", 1),
            "detail": m.group(3).lstrip(", ").strip(),
            "line": raw.strip(),
        })
    return out


# ---------------------------------------------------------------------------- helpers


def _run(argv: list, timeout: float = 60.0) -> tuple:
    """(exit code, stdout, stderr); (None, "", why) when it could not run."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
    except FileNotFoundError:
        return None, "", f"{argv[0]}: not found"
    except PermissionError as exc:
        return None, "", f"{argv[0]}: {exc}"
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]} did not answer within {timeout:g}s"
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _with_timeout(fn, timeout: float):
    """Run fn() in a daemon thread; (value, None) or (None, error text). A wedged GPU can make
    NVML calls hang: the probe must still answer."""
    box = {}  # type: dict

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported, never raised into the agent
            box["error"] = exc

    t = threading.Thread(target=target, name="gpu-probe", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return None, TimeoutError(f"no answer within {timeout:g}s (a GPU may be wedged: "
                                  "see Xid messages in dmesg)")
    if "error" in box:
        return None, box["error"]
    return box.get("value"), None


# ---------------------------------------------------------------------------- gpu_facts


def _nvml_opt(pynvml):
    """opt(fn, *args) -> (value, error): NotSupported -> (None, None); other NVML errors ->
    (None, text)."""
    not_supported = getattr(pynvml, "NVMLError_NotSupported", ())
    nvml_error = pynvml.NVMLError

    def opt(fn, *args):
        try:
            return fn(*args), None
        except not_supported:
            return None, None
        except (nvml_error, AttributeError) as exc:
            return None, str(exc) or type(exc).__name__

    return opt


def _nvml_collect(pynvml) -> dict:
    """Everything gpu_facts reports, through NVML (nvmlInit already done)."""
    opt = _nvml_opt(pynvml)
    driver = _text(pynvml.nvmlSystemGetDriverVersion())
    cuda_fn = getattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", None) or \
        pynvml.nvmlSystemGetCudaDriverVersion
    cuda, _ = opt(cuda_fn)
    count = int(pynvml.nvmlDeviceGetCount())
    devices, processes = [], []  # type: list, list
    for i in range(count):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as exc:
            devices.append({"index": i, "error": str(exc)})
            continue
        devices.append(_nvml_device(pynvml, opt, i, h, processes))
    return {"driver_version": driver, "cuda_driver_version": cuda_version_str(cuda),
            "count": count, "devices": devices, "processes": processes}


def _nvml_device(pynvml, opt, i: int, h, processes: list) -> dict:
    """The facts of GPU I (handle H); its compute processes are appended to PROCESSES."""
    dev = {"index": i}  # type: dict
    errors = {}
    name, err = opt(pynvml.nvmlDeviceGetName, h)
    dev["name"] = None if name is None else _text(name)
    uuid, _ = opt(pynvml.nvmlDeviceGetUUID, h)
    dev["uuid"] = None if uuid is None else _text(uuid)
    pci, _ = opt(pynvml.nvmlDeviceGetPciInfo, h)
    dev["pci_bus_id"] = None if pci is None else _text(getattr(pci, "busId", ""))
    mem, err = opt(pynvml.nvmlDeviceGetMemoryInfo, h)
    if err:
        errors["memory"] = err
    dev["memory_total_mib"] = None if mem is None else int(mem.total) // MIB
    dev["memory_used_mib"] = None if mem is None else int(mem.used) // MIB
    cc, err = opt(pynvml.nvmlDeviceGetCudaComputeCapability, h)
    if err:
        errors["compute_capability"] = err
    dev["compute_capability"] = None if cc is None else f"{int(cc[0])}.{int(cc[1])}"
    ecc, err = opt(pynvml.nvmlDeviceGetTotalEccErrors, h,
                   pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    if err:
        errors["ecc"] = err
    dev["ecc_uncorrected"] = None if ecc is None else int(ecc)
    pm, _ = opt(pynvml.nvmlDeviceGetPersistenceMode, h)
    dev["persistence_mode"] = None if pm is None else pm == pynvml.NVML_FEATURE_ENABLED
    gen, _ = opt(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
    width, _ = opt(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)
    dev["pcie_gen"] = None if gen is None else int(gen)
    dev["pcie_width"] = None if width is None else int(width)
    procs, err = opt(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
    if err:
        errors["processes"] = err
    for p in procs or []:
        used = getattr(p, "usedGpuMemory", None)
        pname, _ = opt(pynvml.nvmlSystemGetProcessName, p.pid)
        processes.append({
            "pid": int(p.pid), "gpu_index": i, "gpu_uuid": dev["uuid"],
            "used_mib": None if used is None else int(used) // MIB,
            "name": None if pname is None else _text(pname),
        })
    if errors:
        dev["errors"] = errors
    return dev


def _nvml_facts(timeout: float) -> tuple:
    """(facts or None, {"available": bool, "error": str|None})."""
    try:
        import pynvml  # noqa: PLC0415  (optional: nvidia-ml-py)
    except ImportError as exc:
        return None, {"available": False, "error": f"pynvml not importable: {exc}"}
    not_found = getattr(pynvml, "NVMLError_LibraryNotFound", ())
    try:
        pynvml.nvmlInit()
    except not_found as exc:
        return None, {"available": False, "error": str(exc)}
    except Exception as exc:  # NVMLError: driver not loaded, unknown (cgroup), ...
        return None, {"available": True, "error": f"nvmlInit: {exc}"}
    try:
        facts, err = _with_timeout(lambda: _nvml_collect(pynvml), timeout)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # already torn down
            pass
    if err is not None:
        return None, {"available": True, "error": f"{type(err).__name__}: {err}"}
    return facts, {"available": True, "error": None}


def _smi_query(smi: str, mode: str, fields, timeout: float) -> tuple:
    """(rows text, fields used, error): drops fields an older nvidia-smi does not know."""
    fields = list(fields)
    for _ in range(len(fields)):
        code, out, err = _run([smi, f"--{mode}={','.join(fields)}",
                               "--format=csv,noheader,nounits"], timeout)
        if code == 0:
            return out, fields, None
        bad = smi_bad_field(out + err)
        if code is not None and bad in fields and len(fields) > 1:
            fields.remove(bad)
            continue
        text = (out + err).strip().splitlines()
        why = text[-1] if text else "no output"
        if code is None:
            return None, fields, err
        return None, fields, f"{os.path.basename(smi)} exited {code}: {why}"
    return None, fields, "nvidia-smi accepted none of the fields"


def _smi_facts(smi: str, timeout: float) -> tuple:
    """(facts or None, {"path", "error"})."""
    import shutil  # only here: with NVML answering, a converged host never needs it

    path = shutil.which(smi) if os.sep not in smi else (smi if os.path.exists(smi) else None)
    if path is None:
        return None, {"path": None, "error": f"{smi} not found on PATH"}
    out, fields, err = _smi_query(path, "query-gpu", SMI_GPU_FIELDS, timeout)
    if out is None:
        return None, {"path": path, "error": err}
    devices = smi_gpu_rows(out, fields)
    driver = next((d.pop("driver_version") for d in devices if d.get("driver_version")), None)
    for d in devices:
        d.pop("driver_version", None)
    code, banner, _ = _run([path], timeout)
    cuda = smi_cuda_version(banner) if code == 0 else None
    procs = []
    app_err = None
    apps, afields, app_err = _smi_query(path, "query-compute-apps", SMI_APP_FIELDS, timeout)
    if apps is not None:
        index = {d.get("uuid"): d.get("index") for d in devices}
        for p in smi_app_rows(apps, afields):
            p["gpu_index"] = index.get(p.get("gpu_uuid"))
            procs.append(p)
    facts = {"driver_version": driver, "cuda_driver_version": cuda, "count": len(devices),
             "devices": devices, "processes": procs}
    return facts, {"path": path, "error": None, "apps_error": app_err}


@probe("gpu_facts")
def gpu_facts(nvml: bool = True, smi: str = "nvidia-smi", timeout: float = 60.0) -> dict:
    """GPUs through NVML, else nvidia-smi; `source` says which ("nvml", "nvidia-smi", None).

    Shape: {source, driver_version, cuda_driver_version ("12.8"), count, devices: [{index,
    name, uuid, pci_bus_id, memory_total_mib, memory_used_mib, compute_capability ("12.0"),
    ecc_uncorrected (None = not supported), persistence_mode, pcie_gen, pcie_width}],
    processes: [{pid (HOST pid), gpu_index, gpu_uuid, used_mib, name}], nvml: {...},
    nvidia_smi: {...}, error (None, or why no GPU could be listed)}.
    """
    result = {"source": None, "driver_version": None, "cuda_driver_version": None, "count": 0,
              "devices": [], "processes": [], "error": None}  # type: dict
    facts = None
    if nvml:
        facts, result["nvml"] = _nvml_facts(timeout)
        if facts is not None:
            result["source"] = "nvml"
    else:
        result["nvml"] = {"available": None, "error": "not asked"}
    if facts is None:
        facts, result["nvidia_smi"] = _smi_facts(smi, timeout)
        if facts is not None:
            result["source"] = "nvidia-smi"
    if facts is not None:
        result.update(facts)
        return result
    nv = result.get("nvml") or {}
    sm = result.get("nvidia_smi") or {}
    if not nv.get("available") and sm.get("path") is None:
        result["error"] = ("no GPU tool on this host: neither NVML (pynvml + libnvidia-ml.so.1) "
                           f"nor nvidia-smi is available ({nv.get('error')}; {sm.get('error')})")
    else:
        result["error"] = "; ".join(f"{k}: {v}" for k, v in (
            ("NVML", nv.get("error")), ("nvidia-smi", sm.get("error"))) if v)
    return result


# ---------------------------------------------------------------------------- uvm_facts

def cuda_init_child(python: str | None = None, timeout: float = 60.0) -> dict:
    """cuInit(0) in a child process (its failure state is sticky per process): the program
    orchestrator/remote/cuda_init.py."""
    code, out, err = _run([python or sys.executable, "-c", module_source("cuda_init")], timeout)
    if code != 0:
        tail = (err or out).strip().splitlines()
        return {"code": None, "source": "unknown",
                "error": f"CUDA init check failed to run (exit {code}): "
                         f"{tail[-1] if tail else 'no output'}"}
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"code": None, "source": "unknown", "error": f"bad answer: {out[-200:]!r}"}
    if res.get("code") is not None:
        res["name"] = CUDA_ERRORS.get(res["code"], f"CUDA error {res['code']}")
    return res


def _node_info(path: str) -> dict:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"path": path, "present": False, "major": None, "minor": None}
    except OSError as exc:
        return {"path": path, "present": None, "major": None, "minor": None,
                "error": str(exc)}
    is_char = stat.S_ISCHR(st.st_mode)
    return {"path": path, "present": True, "char_device": is_char,
            "major": os.major(st.st_rdev) if is_char else None,
            "minor": os.minor(st.st_rdev) if is_char else None}


def _open_rdwr(path: str) -> dict:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else None
        return {"ok": False, "errno": code, "error": exc.strerror or str(exc)}
    os.close(fd)
    return {"ok": True, "errno": None, "error": None}


def _cgroup(devices_list: str, cgroup_root: str) -> dict:
    try:
        with open(devices_list, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = None
    if text is not None:
        return {"version": 1, "devices_list": devices_list, "rules": parse_devices_list(text)}
    v2 = os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
    return {"version": 2 if v2 else None, "devices_list": None, "rules": None}


@probe("uvm_facts")
def uvm_facts(cuda: bool = True, uvm_path: str = "/dev/nvidia-uvm",
              proc_devices: str = "/proc/devices",
              devices_list: str = "/sys/fs/cgroup/devices/devices.list",
              cgroup_root: str = "/sys/fs/cgroup", timeout: float = 60.0) -> dict:
    """Can CUDA use /dev/nvidia-uvm here? Kernel major vs node major vs device cgroup.

    Shape: {proc_major (the kernel's, from /proc/devices: NOT namespaced), char_devices
    ({major: name}), node: {present, major, minor}, major_match, cgroup: {version, rules
    (v1 only), allows_uvm (v1 only, else None)}, open: {ok, errno ("EPERM"...), error},
    cuda_init: {code, name, source ("libcuda"|"simhw"|"unknown"), error}}.
    """
    out = {}  # type: dict
    try:
        with open(proc_devices, encoding="utf-8", errors="replace") as f:
            parsed = parse_proc_devices(f.read())
        out["proc_devices_error"] = None
    except OSError as exc:
        parsed = {"char": {}, "block": {}}
        out["proc_devices_error"] = str(exc)
    out["char_devices"] = {str(k): v for k, v in sorted(parsed["char"].items())}
    out["proc_major"] = next((m for m, n in sorted(parsed["char"].items())
                              if n == "nvidia-uvm"), None)
    node = _node_info(uvm_path)
    out["node"] = node
    out["major_match"] = (None if not node.get("present") or out["proc_major"] is None
                          else node.get("major") == out["proc_major"])
    cg = _cgroup(devices_list, cgroup_root)
    target = node.get("major") if node.get("major") is not None else out["proc_major"]
    minor = node.get("minor") if node.get("minor") is not None else 0
    cg["allows_uvm"] = (devices_allow(cg["rules"], int(target), int(minor))
                        if cg["rules"] is not None and target is not None else None)
    out["cgroup"] = cg
    out["open"] = (_open_rdwr(uvm_path) if node.get("present")
                   else {"ok": False, "errno": "ENOENT", "error": "no such device node"})
    out["cuda_init"] = cuda_init_child(timeout=timeout) if cuda else None
    return out


# ---------------------------------------------------------------------------- shm, xid, disk


@probe("shm_facts")
def shm_facts(path: str = "/dev/shm") -> dict:
    """Size and free bytes of /dev/shm (NCCL needs room there)."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return {"path": path, "exists": False, "size": None, "free": None, "error": str(exc)}
    return {"path": path, "exists": True, "size": st.f_blocks * st.f_frsize,
            "free": st.f_bavail * st.f_frsize, "error": None}


def _tail_text(path: str, max_bytes: int) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


@probe("kernel_xid")
def kernel_xid(kern_log: str = "/var/log/kern.log", dmesg: bool = True, limit: int = 10,
               max_bytes: int = 4 * MIB) -> dict:
    """The last `limit` NVIDIA Xid messages of kern.log and dmesg (deduplicated).

    Shape: {events: [{code, pci, detail, line, source}], codes: [sorted distinct codes],
    sources: {"kern.log": "read"|"absent", "dmesg": "read"|why not}}.
    """
    events = []
    sources = {}
    text = _tail_text(kern_log, max_bytes)
    sources["kern.log"] = "read" if text is not None else "absent"
    for ev in parse_xid_lines(text or ""):
        ev["source"] = kern_log
        events.append(ev)
    if dmesg:
        code, out, err = _run(["dmesg"], timeout=15)
        if code == 0:
            sources["dmesg"] = "read"
            seen = {ev["line"].split("NVRM: Xid", 1)[1] for ev in events}
            for ev in parse_xid_lines(out):
                key = ev["line"].split("NVRM: Xid", 1)[1]
                if key not in seen:
                    ev["source"] = "dmesg"
                    events.append(ev)
        else:
            sources["dmesg"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
    events = events[-int(limit):] if limit else events
    return {"events": events, "codes": sorted({e["code"] for e in events}), "sources": sources}


@probe("dir_usage")
def dir_usage(path: str, max_entries: int = 200000) -> dict:
    """Bytes allocated to files under `path` (no symlinks followed); 0 when it is absent."""
    total = 0
    files = 0
    complete = True
    target = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(target):
        return {"path": target, "exists": os.path.exists(target), "bytes": 0, "files": 0,
                "complete": True}
    for root, _dirs, names in os.walk(target):
        for name in names:
            files += 1
            if files > max_entries:
                complete = False
                break
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                blocks = getattr(st, "st_blocks", None)
                total += blocks * 512 if blocks is not None else st.st_size
        if not complete:
            break
    return {"path": target, "exists": True, "bytes": total, "files": files,
            "complete": complete}
