"""Stand-in for nvidia-ml-py (module ``pynvml``) on a simulated host; reads the simulated hardware.

Shadows the real package (the host's site dir comes first on PYTHONPATH). Same names, return
types (str, ints, bytes counts) and error classes (``NVMLError`` plus one ``NVMLError_<Name>``
subclass per ``NVML_ERROR_*`` code) as nvidia-ml-py 12/13 for the calls it implements. With
``nvml_absent`` in the host state, nvmlInit raises NVMLError_LibraryNotFound as when
libnvidia-ml.so.1 is missing. Process pids are HOST pids, as with the real NVML in a container.
"""

# ruff: noqa: UP031  (host-side code keeps printf-style formatting for its tables)

from __future__ import annotations

import json
import os
import string
import sys
import threading

import simhw

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_TEMPERATURE_GPU = 0
NVML_INIT_FLAG_NO_GPUS = 1
NVML_INIT_FLAG_NO_ATTACH = 2
NVML_DEVICE_NAME_BUFFER_SIZE = 64
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_UUID_BUFFER_SIZE = 80
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80
NVML_VALUE_NOT_AVAILABLE_uint = 0xFFFFFFFF

_MIB = 1024 * 1024


class NVMLError(Exception):
    """An NVML call failed; `value` is the NVML_ERROR_* code."""

    _valClassMapping: dict = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(cls, value):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value):
        Exception.__init__(self, value)
        self.value = value

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, "NVML Error with code %d" % self.value)

    def __eq__(self, other):
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self):
        return hash(self.value)


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        cls_name = "NVMLError_" + string.capwords(name[len("NVML_ERROR_"):], "_").replace("_", "")
        value = getattr(module, name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)

            return new

        def gen_init(val):
            def init(self, *args):
                NVMLError.__init__(self, val)

            return init

        cls = type(cls_name, (NVMLError,), {"__new__": gen_new(value), "__init__": gen_init(value)})
        cls.__module__ = __name__
        setattr(module, cls_name, cls)
        NVMLError._valClassMapping[value] = cls


_make_error_classes()


def nvmlExceptionClass(nvmlErrorCode):  # noqa: N802, N803
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError("nvmlErrorCode %s is not valid" % nvmlErrorCode)
    return NVMLError._valClassMapping[nvmlErrorCode]


def nvmlErrorString(result):  # noqa: N802
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


class nvmlFriendlyObject:  # noqa: N801
    """Plain attribute bag, like the real module's struct-to-object conversion."""

    def __init__(self, dictionary):
        for k, v in dictionary.items():
            setattr(self, k, v)

    def __str__(self):
        return str(self.__dict__)

    __repr__ = __str__


class c_nvmlDevice_t:  # noqa: N801
    """A device handle: remembers the GPU's UUID (so a lost GPU is noticed)."""

    def __init__(self, uuid):
        self.uuid = uuid

    def __repr__(self):
        return "<simulated nvmlDevice %s>" % self.uuid


_lock = threading.Lock()
_refcount = 0


def _check(code):
    if code is not None:
        raise NVMLError(code)


#: (the state file's inode, mtime and size, its parsed JSON): a query reads the file again only
#: when it changed (simhw.write_state replaces it, so every write makes a new inode). A real
#: NVML query is a driver call; re-parsing the state at each of gpu_facts' ~90 calls cost the
#: agent ~15 ms of CPU per host check
_parsed = (None, None)


def _read_state() -> dict:
    """simhw.read_state(), from the cache while the file is unchanged; allocations of
    processes that ended are left out at every call, as the driver frees their memory."""
    global _parsed
    path = simhw.state_path()
    try:
        st = os.stat(path)
    except OSError:
        return simhw.read_state(path)  # raises the simulator's own error
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    cached_key, raw = _parsed
    if cached_key != key:
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError):
            return simhw.read_state(path)
        _parsed = (key, raw)
    state = dict(raw, allocations=dict(raw.get("allocations") or {}))
    simhw.gc_allocations(state)
    return state


_infos = (None, None)


def _gpu_info(state: dict) -> list:
    """simhw.gpu_info(STATE), kept while the state file and the live allocations are the same
    (every NVML query of a device asks for it)."""
    global _infos
    key = (_parsed[0], tuple(sorted(state.get("allocations") or {})))
    if _infos[0] != key or key[0] is None:
        _infos = (key, simhw.gpu_info(state))
    return _infos[1]


def nvmlInitWithFlags(flags):  # noqa: N802
    global _refcount
    try:
        state = _read_state()
    except simhw.SimHWError:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None
    _check(simhw.nvml_error(state))
    with _lock:
        _refcount += 1


def nvmlInit():  # noqa: N802
    nvmlInitWithFlags(0)


def nvmlShutdown():  # noqa: N802
    global _refcount
    with _lock:
        if _refcount <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _refcount -= 1


def _state():
    if _refcount <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    state = _read_state()
    _check(simhw.smi_error(state))
    return state


def _gpu(handle):
    state = _state()
    for g in _gpu_info(state):
        if g["uuid"] == getattr(handle, "uuid", None):
            return state, g
    if any(g["uuid"] == getattr(handle, "uuid", None) for g in state.get("gpus", [])):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlSystemGetDriverVersion():  # noqa: N802
    return str(_state()["driver"]["version"])


def nvmlSystemGetNVMLVersion():  # noqa: N802
    state = _state()
    return "%s.%s" % (str(state["driver"]["cuda"]).split(".")[0], state["driver"]["version"])


def nvmlSystemGetCudaDriverVersion():  # noqa: N802
    _state()
    return simhw.cuda_driver_version_int()


def nvmlSystemGetCudaDriverVersion_v2():  # noqa: N802
    return nvmlSystemGetCudaDriverVersion()


def nvmlSystemGetProcessName(pid):  # noqa: N802
    _state()
    try:
        with open("/proc/%d/cmdline" % int(pid), "rb") as f:
            return f.read().split(b"\0")[0].decode("utf-8", "replace")
    except OSError:
        raise NVMLError(NVML_ERROR_NOT_FOUND) from None


def nvmlDeviceGetCount():  # noqa: N802
    return len(_gpu_info(_state()))


def nvmlDeviceGetHandleByIndex(index):  # noqa: N802
    gpus = _gpu_info(_state())
    index = int(index)
    if index < 0 or index >= len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(gpus[index]["uuid"])


def nvmlDeviceGetHandleByUUID(uuid):  # noqa: N802
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for g in _gpu_info(_state()):
        if g["uuid"] == uuid:
            return c_nvmlDevice_t(uuid)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByPciBusId(pciBusId):  # noqa: N802, N803
    bus = pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId
    for g in _gpu_info(_state()):
        if g["pci_bus_id"].lower().endswith(bus.lower()[-12:]):
            return c_nvmlDevice_t(g["uuid"])
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle):  # noqa: N802
    return _gpu(handle)[1]["index"]


def nvmlDeviceGetMinorNumber(handle):  # noqa: N802
    return _gpu(handle)[1]["index"]


def nvmlDeviceGetName(handle):  # noqa: N802
    return _gpu(handle)[1]["name"]


def nvmlDeviceGetUUID(handle):  # noqa: N802
    return _gpu(handle)[1]["uuid"]


def nvmlDeviceGetPciInfo(handle):  # noqa: N802
    g = _gpu(handle)[1]
    bus_id = g["pci_bus_id"]
    dom, bus, devfn = bus_id.split(":")
    return nvmlFriendlyObject({
        "busIdLegacy": bus_id[4:], "busId": bus_id, "domain": int(dom, 16), "bus": int(bus, 16),
        "device": int(devfn.split(".")[0], 16), "pciDeviceId": 0x2BB510DE,
        "pciSubSystemId": 0x204E10DE,
    })


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetMemoryInfo(handle, version=None):  # noqa: N802
    g = _gpu(handle)[1]
    total = g["memory_total_mib"] * _MIB
    used = g["memory_used_mib"] * _MIB
    info = {"total": total, "free": total - used, "used": used}
    if version:
        info["version"] = version
        info["reserved"] = 0
    return nvmlFriendlyObject(info)


def nvmlDeviceGetCudaComputeCapability(handle):  # noqa: N802
    cc = _gpu(handle)[1]["compute_capability"]
    return (int(cc[0]), int(cc[1]))


def nvmlDeviceGetEccMode(handle):  # noqa: N802
    _gpu(handle)
    return [NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED]


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):  # noqa: N802, N803
    g = _gpu(handle)[1]
    if int(errorType) == NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return g["ecc_uncorrected"]
    if int(errorType) == NVML_MEMORY_ERROR_TYPE_CORRECTED:
        return g["ecc_corrected"]
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetPersistenceMode(handle):  # noqa: N802
    return NVML_FEATURE_ENABLED if _gpu(handle)[1]["persistence_mode"] else NVML_FEATURE_DISABLED


def nvmlDeviceGetCurrPcieLinkGeneration(handle):  # noqa: N802
    return _gpu(handle)[1]["pcie_gen"]


def nvmlDeviceGetMaxPcieLinkGeneration(handle):  # noqa: N802
    return _gpu(handle)[1]["pcie_gen_max"]


def nvmlDeviceGetCurrPcieLinkWidth(handle):  # noqa: N802
    return _gpu(handle)[1]["pcie_width"]


def nvmlDeviceGetMaxPcieLinkWidth(handle):  # noqa: N802
    return _gpu(handle)[1]["pcie_width_max"]


def nvmlDeviceGetTemperature(handle, sensor):  # noqa: N802
    return _gpu(handle)[1]["temperature_c"]


def nvmlDeviceGetPowerUsage(handle):  # noqa: N802
    return _gpu(handle)[1]["power_draw_w"] * 1000


def nvmlDeviceGetEnforcedPowerLimit(handle):  # noqa: N802
    return _gpu(handle)[1]["power_limit_w"] * 1000


def nvmlDeviceGetUtilizationRates(handle):  # noqa: N802
    u = _gpu(handle)[1]["utilization_pct"]
    return nvmlFriendlyObject({"gpu": u, "memory": u})


def nvmlDeviceGetComputeRunningProcesses(handle):  # noqa: N802
    state, g = _gpu(handle)
    return [
        nvmlFriendlyObject({"pid": p["pid"], "usedGpuMemory": p["used_mib"] * _MIB,
                            "gpuInstanceId": NVML_VALUE_NOT_AVAILABLE_uint,
                            "computeInstanceId": NVML_VALUE_NOT_AVAILABLE_uint})
        for p in simhw.processes(state) if p["gpu_uuid"] == g["uuid"]
    ]


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle):  # noqa: N802
    _gpu(handle)
    return []


nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses
