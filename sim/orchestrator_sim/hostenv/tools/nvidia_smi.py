"""``nvidia-smi`` of a simulated host (driver 580 output formats), reading the simulated hardware.

Supports: no arguments (summary table), ``-L``, ``-q``, ``--query-gpu=F,...`` and
``--query-compute-apps=F,...`` with ``--format=csv[,noheader][,nounits]``, ``-i/--id``.
Like the real tool it needs only the 195 major (works while nvidia-uvm is broken) and fails
when the driver is gone (exit 9) or the device cgroup denies /dev/nvidiactl (exit 255).
"""

# ruff: noqa: UP031  (host-side code keeps printf-style formatting for its tables)

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site"))

import simhw  # noqa: E402

_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def _yn(flag: bool) -> str:
    return "Enabled" if flag else "Disabled"


# field -> (header, unit, getter(gpu, state))
_GPU_FIELDS = {
    "timestamp": ("timestamp", "", lambda g, s: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": ("driver_version", "", lambda g, s: s["driver"]["version"]),
    "count": ("count", "", lambda g, s: str(len(simhw.gpu_info(s)))),
    "index": ("index", "", lambda g, s: str(g["index"])),
    "name": ("name", "", lambda g, s: g["name"]),
    "serial": ("serial", "", lambda g, s: "18%011d" % (abs(hash(g["uuid"])) % 10**11)),
    "uuid": ("uuid", "", lambda g, s: g["uuid"]),
    "pci.bus_id": ("pci.bus_id", "", lambda g, s: "0000" + g["pci_bus_id"]),
    "pci.device_id": ("pci.device_id", "", lambda g, s: "0x2BB510DE"),
    "minor_number": ("minor_number", "", lambda g, s: str(g["index"])),
    "vbios_version": ("vbios_version", "", lambda g, s: "98.02.52.00.02"),
    "persistence_mode": ("persistence_mode", "", lambda g, s: _yn(g["persistence_mode"])),
    "display_mode": ("display_mode", "", lambda g, s: "Disabled"),
    "display_active": ("display_active", "", lambda g, s: "Disabled"),
    "compute_mode": ("compute_mode", "", lambda g, s: "Default"),
    "compute_cap": ("compute_cap", "", lambda g, s: "%d.%d" % tuple(g["compute_capability"])),
    "pstate": ("pstate", "", lambda g, s: "P0" if g["memory_used_mib"] else "P8"),
    "fan.speed": ("fan.speed", "%", lambda g, s: "[N/A]"),
    "temperature.gpu": ("temperature.gpu", "", lambda g, s: str(g["temperature_c"])),
    "power.draw": ("power.draw", "W", lambda g, s: "%.2f" % g["power_draw_w"]),
    "power.limit": ("power.limit", "W", lambda g, s: "%.2f" % g["power_limit_w"]),
    "utilization.gpu": ("utilization.gpu", "%", lambda g, s: str(g["utilization_pct"])),
    "utilization.memory": ("utilization.memory", "%", lambda g, s: str(g["utilization_pct"])),
    "memory.total": ("memory.total", "MiB", lambda g, s: str(g["memory_total_mib"])),
    "memory.reserved": ("memory.reserved", "MiB", lambda g, s: "0"),
    "memory.used": ("memory.used", "MiB", lambda g, s: str(g["memory_used_mib"])),
    "memory.free": ("memory.free", "MiB", lambda g, s: str(g["memory_free_mib"])),
    "ecc.mode.current": ("ecc.mode.current", "", lambda g, s: "Enabled"),
    "ecc.mode.pending": ("ecc.mode.pending", "", lambda g, s: "Enabled"),
    "ecc.errors.corrected.volatile.total": (
        "ecc.errors.corrected.volatile.total", "", lambda g, s: str(g["ecc_corrected"])),
    "ecc.errors.uncorrected.volatile.total": (
        "ecc.errors.uncorrected.volatile.total", "", lambda g, s: str(g["ecc_uncorrected"])),
    "ecc.errors.corrected.aggregate.total": (
        "ecc.errors.corrected.aggregate.total", "", lambda g, s: str(g["ecc_corrected"])),
    "ecc.errors.uncorrected.aggregate.total": (
        "ecc.errors.uncorrected.aggregate.total", "", lambda g, s: str(g["ecc_uncorrected"])),
    "pcie.link.gen.current": ("pcie.link.gen.current", "", lambda g, s: str(g["pcie_gen"])),
    "pcie.link.gen.gpucurrent": (
        "pcie.link.gen.gpucurrent", "", lambda g, s: str(g["pcie_gen"])),
    "pcie.link.gen.max": ("pcie.link.gen.max", "", lambda g, s: str(g["pcie_gen_max"])),
    "pcie.link.width.current": (
        "pcie.link.width.current", "", lambda g, s: str(g["pcie_width"])),
    "pcie.link.width.max": ("pcie.link.width.max", "", lambda g, s: str(g["pcie_width_max"])),
    "mig.mode.current": ("mig.mode.current", "", lambda g, s: "[N/A]"),
    "clocks.max.sm": ("clocks.max.sm", "MHz", lambda g, s: "2430"),
}
_GPU_ALIASES = {
    "gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "persistence-mode": "persistence_mode", "clocks.max.sm": "clocks.max.sm",
    "pcie.link.gen.gpumax": "pcie.link.gen.max", "gpu_serial": "serial",
    "ecc.mode": "ecc.mode.current",
}

_APP_FIELDS = {
    "pid": ("pid", "", lambda p, g: str(p["pid"])),
    "process_name": ("process_name", "", lambda p, g: p["name"]),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda p, g: str(p["used_mib"])),
    "gpu_uuid": ("gpu_uuid", "", lambda p, g: p["gpu_uuid"]),
    "gpu_name": ("gpu_name", "", lambda p, g: g["name"]),
    "gpu_bus_id": ("gpu_bus_id", "", lambda p, g: "0000" + g["pci_bus_id"]),
    "gpu_serial": ("gpu_serial", "", lambda p, g: "[N/A]"),
}
_APP_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}


class _Usage(Exception):
    pass


def _parse(argv: list) -> dict:
    opts = {"mode": "summary", "fields": None, "format": None, "ids": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        key, eq, val = a.partition("=")
        if a in ("-L", "--list-gpus"):
            opts["mode"] = "list"
        elif a in ("-q", "--query"):
            opts["mode"] = "query"
        elif key in ("--query-gpu", "--query-compute-apps"):
            if not eq:
                i += 1
                val = argv[i] if i < len(argv) else ""
            opts["mode"] = "gpu" if key == "--query-gpu" else "apps"
            opts["fields"] = [f.strip() for f in val.split(",") if f.strip()]
        elif key in ("--format", "-f") and key == "--format":
            if not eq:
                i += 1
                val = argv[i] if i < len(argv) else ""
            opts["format"] = [f.strip() for f in val.split(",")]
        elif key in ("-i", "--id"):
            if not eq:
                i += 1
                val = argv[i] if i < len(argv) else ""
            opts["ids"] = [v.strip() for v in val.split(",")]
        elif a in ("-h", "--help"):
            opts["mode"] = "help"
        else:
            raise _Usage("ERROR: Option %s is not recognized. Please run 'nvidia-smi -h'." % a)
        i += 1
    return opts


def _select(gpus: list, ids) -> list:
    if not ids:
        return gpus
    out = []
    for ident in ids:
        for g in gpus:
            if ident in (str(g["index"]), g["uuid"], "0000" + g["pci_bus_id"], g["pci_bus_id"]):
                out.append(g)
                break
        else:
            raise _Usage("No devices were found" if ident.isdigit() else
                         "Invalid device identifier %s" % ident)
    return out


def _csv(fields: list, table: dict, aliases: dict, rows: list, fmt: list) -> str:
    if "csv" not in fmt:
        raise _Usage("ERROR: Only csv format is supported by this nvidia-smi. "
                     "Please run 'nvidia-smi -h' for help.")
    keys = []
    for f in fields:
        k = aliases.get(f.lower(), f.lower())
        if k not in table:
            raise _Usage('Field "%s" is not a valid field to query.\n' % f)
        keys.append(k)
    nounits = "nounits" in fmt
    out = []
    if "noheader" not in fmt:
        out.append(", ".join(
            table[k][0] + ("" if not table[k][1] else " [%s]" % table[k][1]) for k in keys))
    for row in rows:
        vals = []
        for k in keys:
            v = table[k][2](*row)
            unit = table[k][1]
            if unit and not nounits and not v.startswith("["):
                v = "%s %s" % (v, unit)
            vals.append(v)
        out.append(", ".join(vals))
    return "".join(line + "\n" for line in out)


def _summary(state: dict, gpus: list) -> str:
    drv = state["driver"]
    sep = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    out = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ",
           "+" + "-" * 89 + "+",
           "| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|"
           % (drv["version"], drv["version"], drv["cuda"]),
           sep,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A "
           "| Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage "
           "| GPU-Util  Compute M. |",
           "|                                         |                        "
           "|               MIG M. |",
           "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    for g in gpus:
        name = g["name"] if len(g["name"]) <= 30 else g["name"][:27] + "..."
        pm = "On" if g["persistence_mode"] else "Off"
        out.append("|%4d  %-30s %-3s |   %16s Off |%21s |"
                   % (g["index"], name, pm, "0000" + g["pci_bus_id"], g["ecc_uncorrected"]))
        left = " N/A   %2dC    %s" % (g["temperature_c"], "P0" if g["memory_used_mib"] else "P8")
        power = "%dW / %4dW" % (g["power_draw_w"], g["power_limit_w"])
        out.append("|%s%s |%8dMiB / %6dMiB |%7d%%%13s |"
                   % (left, power.rjust(40 - len(left)), g["memory_used_mib"],
                      g["memory_total_mib"], g["utilization_pct"], "Default"))
        out.append("|%41s|%24s|%21s |" % ("", "", "N/A"))
        out.append(sep)
    out += ["", "+" + "-" * 89 + "+",
            "| Processes:" + " " * 78 + "|",
            "|  GPU   GI   CI              PID   Type   Process name"
            "                        GPU Memory |",
            "|        ID   ID                                                 "
            "              Usage      |",
            "|" + "=" * 89 + "|"]
    procs = [p for p in simhw.processes(state) if p["gpu_uuid"] in {g["uuid"] for g in gpus}]
    if not procs:
        out.append("|  No running processes found" + " " * 61 + "|")
    for p in procs:
        name = p["name"] if len(p["name"]) <= 34 else "..." + p["name"][-31:]
        out.append("|  %3d   N/A  N/A  %14d      C   %-34s %8dMiB |"
                   % (p["gpu_index"], p["pid"], name, p["used_mib"]))
    out.append("+" + "-" * 89 + "+")
    return "\n".join(out) + "\n"


def _query(state: dict, gpus: list) -> str:
    drv = state["driver"]
    out = ["", "==============NVSMI LOG==============", "",
           "Timestamp                                 : " + time.strftime("%a %b %d %H:%M:%S %Y"),
           "Driver Version                            : " + drv["version"],
           "CUDA Version                              : " + drv["cuda"], "",
           "Attached GPUs                             : %d" % len(simhw.gpu_info(state))]
    for g in gpus:
        out += ["GPU 0000" + g["pci_bus_id"],
                "    Product Name                          : " + g["name"],
                "    Persistence Mode                      : " + _yn(g["persistence_mode"]),
                "    GPU UUID                              : " + g["uuid"],
                "    Minor Number                          : %d" % g["index"],
                "    PCI",
                "        Bus Id                            : 0000" + g["pci_bus_id"],
                "        GPU Link Info",
                "            PCIe Generation",
                "                Max                       : %d" % g["pcie_gen_max"],
                "                Current                   : %d" % g["pcie_gen"],
                "            Link Width",
                "                Max                       : %dx" % g["pcie_width_max"],
                "                Current                   : %dx" % g["pcie_width"],
                "    FB Memory Usage",
                "        Total                             : %d MiB" % g["memory_total_mib"],
                "        Reserved                          : 0 MiB",
                "        Used                              : %d MiB" % g["memory_used_mib"],
                "        Free                              : %d MiB" % g["memory_free_mib"],
                "    Compute Mode                          : Default",
                "    ECC Mode",
                "        Current                           : Enabled",
                "        Pending                           : Enabled",
                "    ECC Errors",
                "        Volatile",
                "            DRAM Correctable              : %d" % g["ecc_corrected"],
                "            DRAM Uncorrectable            : %d" % g["ecc_uncorrected"], ""]
    return "\n".join(out) + "\n"


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts = _parse(argv)
        if opts["mode"] == "help":
            sys.stdout.write("NVIDIA System Management Interface -- simulated (see sim docs)\n")
            return 0
        state = simhw.read_state()
        err = simhw.smi_error(state)
        if err == 9:
            sys.stdout.write(_NO_DRIVER)
            return 9
        if err is not None:
            sys.stdout.write("Failed to initialize NVML: Unknown Error\n")
            return 255
        all_gpus = simhw.gpu_info(state)
        if not all_gpus:
            sys.stdout.write("No devices were found\n")
            return 6
        gpus = _select(all_gpus, opts["ids"])
        mode = opts["mode"]
        if mode == "list":
            text = "".join("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"])
                           for g in gpus)
        elif mode == "query":
            text = _query(state, gpus)
        elif mode in ("gpu", "apps"):
            if opts["format"] is None:
                raise _Usage("ERROR: --format must be specified with %s. "
                             "Please run 'nvidia-smi -h' for help."
                             % ("--query-gpu" if mode == "gpu" else "--query-compute-apps"))
            if mode == "gpu":
                text = _csv(opts["fields"], _GPU_FIELDS, _GPU_ALIASES,
                            [(g, state) for g in gpus], opts["format"])
            else:
                by_uuid = {g["uuid"]: g for g in gpus}
                rows = [(p, by_uuid[p["gpu_uuid"]]) for p in simhw.processes(state)
                        if p["gpu_uuid"] in by_uuid]
                text = _csv(opts["fields"], _APP_FIELDS, _APP_ALIASES, rows, opts["format"])
        else:
            text = _summary(state, gpus)
        sys.stdout.write(text)
        return 0
    except _Usage as exc:
        sys.stdout.write(str(exc).rstrip("\n") + "\n" + ("\n" if "valid field" in str(exc) else ""))
        return 2
    except simhw.SimHWError as exc:
        sys.stderr.write("nvidia-smi (simulated): %s\n" % exc)
        return 9


if __name__ == "__main__":
    sys.exit(main())
