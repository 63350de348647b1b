"""Faults of the simulated hosts: what each one changes, and how `--off` undoes it.

Each fault is applied by the daemon to one box (a GPU host and its hypervisor) and recorded in
the box's state (``faults``), so it persists until cleared. ``reboot`` is an event, not a state.
The hub faults act on the shared model hub.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator_sim import hypervisor as hv
from orchestrator_sim.hostenv.site import simhw

if TYPE_CHECKING:
    from orchestrator_sim.fleet import Box, Daemon


class FaultError(Exception):
    """A fault request that cannot be applied (unknown name, bad parameter, no hub...)."""


@dataclass(frozen=True)
class Fault:
    """A named fault: help text, parameter defaults, and how to switch it on and off."""

    name: str
    help: str
    params: dict[str, Any]
    on: Callable[[Daemon, Box, dict], Any]
    off: Callable[[Daemon, Box, dict], Any] | None


def _record(state: dict, name: str, params: dict | None) -> None:
    faults = state.setdefault("faults", {})
    if params is None:
        faults.pop(name, None)
    else:
        faults[name] = params


def _simple(name: str) -> tuple[Callable, Callable]:
    def on(d: Daemon, box: Box, params: dict) -> None:
        d.update_state(box, lambda s: _record(s, name, params))

    def off(d: Daemon, box: Box, params: dict) -> None:
        d.update_state(box, lambda s: _record(s, name, None))

    return on, off


# ---------------------------------------------------------------------------- reboot


def _reboot(d: Daemon, box: Box, params: dict) -> dict:
    down = params.get("down_seconds")
    if down is None:
        down = max(0.5, d.cfg["reboot_seconds"] * d.cfg["time_scale"])
    return d.reboot(box, float(down), wait=bool(params.get("wait", False)))


# ---------------------------------------------------------------------------- uvm / cgroup


def _uvm_cgroup_on(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        kernel, cont = state["kernel"], state["container"]
        majors = {m for m in (kernel.get("uvm_major"), cont.get("node_major")) if m} - {195}
        if box.conf_path is not None:
            box.conf_path.write_text(hv.drop_uvm_allow(box.conf_path.read_text(), majors))
        cont["allow"] = hv.rules_without(cont.get("allow"), majors)
        _record(state, "uvm-cgroup", params)

    d.update_state(box, apply)


def _uvm_cgroup_off(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        kernel, cont = state["kernel"], state["container"]
        if box.conf_path is not None:
            box.conf_path.write_text(hv.add_uvm_allow(box.conf_path.read_text(),
                                                      int(kernel["uvm_major"])))
            node = cont.get("node_major")
            if node is not None:
                cont["allow"] = list(cont.get("allow") or []) + [f"c {node}:* rwm"]
        else:
            cont["allow"] = None
        _record(state, "uvm-cgroup", None)

    d.update_state(box, apply)


def _uvm_node_missing_on(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        state["kernel"].update({"uvm_loaded": False, "host_node_major": None})
        state["container"]["node_major"] = None
        _record(state, "uvm-node-missing", params)

    d.update_state(box, apply)


def _uvm_node_missing_off(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        kernel = state["kernel"]
        kernel.update({"uvm_loaded": True, "host_node_major": kernel["uvm_major"]})
        state["container"]["node_major"] = kernel["uvm_major"]
        _record(state, "uvm-node-missing", None)

    d.update_state(box, apply)


# ---------------------------------------------------------------------------- GPUs and driver


def _gpu_missing_on(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        gpus = state["gpus"]
        idx = int(params.get("gpu", len(gpus) - 1))
        if not 0 <= idx < len(gpus):
            raise FaultError(f"gpu-missing: --gpu must be 0..{len(gpus) - 1}, got {idx}")
        g = gpus[idx]
        g["lost"] = True
        bus = g["pci_bus_id"][:-2]  # 0000:db:00
        simhw.log_kernel(state, f"NVRM: GPU at PCI:{bus}: {g['uuid']}")
        simhw.log_kernel(state, f"NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, "
                                "GPU has fallen off the bus.")
        simhw.log_kernel(state, f"NVRM: GPU {g['pci_bus_id']}: GPU has fallen off the bus.")
        _record(state, "gpu-missing", dict(params, gpu=idx))

    d.update_state(box, apply)


def _gpu_missing_off(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        for g in state["gpus"]:
            g["lost"] = False
        _record(state, "gpu-missing", None)

    d.update_state(box, apply)


def _driver_old_on(d: Daemon, box: Box, params: dict) -> None:
    def apply(state: dict) -> None:
        state["driver"].update({"version": str(params.get("version", "550.54.15")),
                                "cuda": str(params.get("cuda", "12.4"))})
        _record(state, "driver-old", params)

    d.update_state(box, apply)


def _driver_old_off(d: Daemon, box: Box, params: dict) -> None:
    prof = d.profile

    def apply(state: dict) -> None:
        state["driver"].update({"version": prof.driver_version, "cuda": prof.cuda_version})
        _record(state, "driver-old", None)

    d.update_state(box, apply)


def _flag(name: str, key: str, section: str | None = None) -> tuple[Callable, Callable]:
    def setter(value: bool) -> Callable:
        def fn(d: Daemon, box: Box, params: dict) -> None:
            def apply(state: dict) -> None:
                target = state if section is None else state[section]
                target[key] = value if key != "loaded" else not value
                _record(state, name, params if value else None)

            d.update_state(box, apply)

        return fn

    return setter(True), setter(False)


# ---------------------------------------------------------------------------- stale server


def _port_open(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.3):
        return True
    return False


def _stale_on(d: Daemon, box: Box, params: dict) -> dict:
    host = box.container
    port = int(params.get("port", 30000))
    mib = int(params.get("mib", 90000))
    if _port_open(host.address, port):
        raise FaultError(f"stale-server: {host.address}:{port} is already in use on {host.name}")
    model = str(host.home / "models" / "Kimi-K2-Instruct")
    env = host.base_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{d.hostenv / 'tools' / 'stale'}"
    log_path = host.root / "var" / "log" / "sglang-old.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(d.host_python), "-m", "sglang.launch_server", "--model-path", model,
            "--host", host.address, "--port", str(port), "--tp-size", "8",
            "--trust-remote-code", "--sim-mib-per-gpu", str(mib)]
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(argv, cwd=str(host.home), env=env, stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True, name="sim-stale-reaper").start()
    deadline = time.monotonic() + 15
    while not _port_open(host.address, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            tail = log_path.read_text(errors="replace")[-2000:]
            raise FaultError(f"stale-server did not start on {host.name}: {tail}")
        time.sleep(0.02)
    record = dict(params, pid=proc.pid, port=port, mib=mib)
    d.update_state(box, lambda s: _record(s, "stale-server", record))
    return record


def _stale_off(d: Daemon, box: Box, params: dict) -> None:
    rec = simhw.fault("stale-server", simhw.read_state(str(box.state_path))) or {}
    pid = rec.get("pid")
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and simhw._pid_alive(int(pid)):
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGKILL)
    d.update_state(box, lambda s: _record(s, "stale-server", None))


# ---------------------------------------------------------------------------- ssh / hub


def _ssh_flaky_on(d: Daemon, box: Box, params: dict) -> None:
    rate = float(params.get("rate", 0.5))
    within = float(params.get("within", 2.0))
    if not 0.0 <= rate <= 1.0:
        raise FaultError(f"ssh-flaky: --rate must be between 0 and 1, got {rate}")
    d.update_state(box, lambda s: _record(s, "ssh-flaky", dict(params, rate=rate,
                                                               within=within)))
    d.flaky_changed(box)


def _ssh_flaky_off(d: Daemon, box: Box, params: dict) -> None:
    d.update_state(box, lambda s: _record(s, "ssh-flaky", None))
    d.flaky_changed(box)


def _hub(name: str) -> tuple[Callable, Callable]:
    def setter(value: bool) -> Callable:
        def fn(d: Daemon, box: Box, params: dict) -> None:
            if d.hub is None:
                raise FaultError(f"{name}: the simulated model hub is not running "
                                 "(started without the hub?)")
            d.hub.set_fault(name, value)

        return fn

    return setter(True), setter(False)


def _disk_full_params(params: dict) -> dict:
    return dict(params, free_mib=int(params.get("free_mib", 100)))


_no_pip = _simple("no-pip")
_disk = _simple("disk-full")
_shm = _simple("shm-small")
_nvml = _flag("nvml-absent", "nvml_absent")
_drv_gone = _flag("driver-gone", "loaded", "driver")
_hub_flaky = _hub("hub-flaky")
_hub_gated = _hub("hub-gated")
_hub_down = _hub("hub-down")
_hub_unreachable = _hub("hub-unreachable")

FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault("reboot", "power-cycle the box: SSH down for --down-seconds, every process killed, "
          "/tmp wiped, the nvidia-uvm major re-rolled while the container's cgroup keeps the old "
          "one (CUDA init 999 until fixed on the hypervisor)",
          {"down_seconds": None, "wait": False}, _reboot, None),
    Fault("uvm-cgroup", "the container's device cgroup (and its conf) loses the uvm major: "
          "nvidia-smi works, CUDA init 999, open(/dev/nvidia-uvm) EPERM",
          {}, _uvm_cgroup_on, _uvm_cgroup_off),
    Fault("uvm-node-missing", "nvidia-uvm not loaded at boot: no /dev/nvidia-uvm (fix: "
          "nvidia-modprobe -u -c=0 on the hypervisor, then restart the container)",
          {}, _uvm_node_missing_on, _uvm_node_missing_off),
    Fault("gpu-missing", "one GPU fell off the bus (Xid 79 in the kernel log); 7 GPUs remain",
          {"gpu": None}, _gpu_missing_on, _gpu_missing_off),
    Fault("stale-server", "an old sglang server holds port 30000 and GPU memory",
          {"mib": 90000, "port": 30000}, _stale_on, _stale_off),
    Fault("disk-full", "statvfs of the host's disk reports almost no free space",
          {"free_mib": 100}, lambda d, b, p: _disk[0](d, b, _disk_full_params(p)), _disk[1]),
    Fault("shm-small", "/dev/shm is 64 MiB", {"shm_mib": 64},
          lambda d, b, p: _shm[0](d, b, dict(p, shm_mib=int(p.get("shm_mib", 64)))), _shm[1]),
    Fault("no-pip", "python3 -m venv fails (no ensurepip), like Debian without python3-venv",
          {}, *_no_pip),
    Fault("nvml-absent", "the NVML library is missing: pynvml.nvmlInit raises "
          "NVMLError_LibraryNotFound (nvidia-smi still works)", {}, *_nvml),
    Fault("driver-old", "driver 550.54.15 / CUDA 12.4: too old for sm_120 (CUDA init 35)",
          {"version": "550.54.15", "cuda": "12.4"}, _driver_old_on, _driver_old_off),
    Fault("driver-gone", "the NVIDIA driver is not loaded: nvidia-smi fails (exit 9)",
          {}, *_drv_gone),
    Fault("ssh-flaky", "SSH sessions are cut at random: each new channel is cut with "
          "probability --rate within --within seconds", {"rate": 0.5, "within": 2.0},
          _ssh_flaky_on, _ssh_flaky_off),
    Fault("hub-flaky", "the model hub drops the first download of each large file halfway",
          {}, *_hub_flaky),
    Fault("hub-gated", "the model hub answers 401 GatedRepo without the right token",
          {}, *_hub_gated),
    Fault("hub-down", "the model hub answers 503 on every route (an outage behind its CDN)",
          {}, *_hub_down),
    Fault("hub-unreachable", "the model hub's port refuses connections (down, or unreachable "
          "from the box)", {}, *_hub_unreachable),
]}


def get(name: str) -> Fault:
    try:
        return FAULTS[name]
    except KeyError:
        raise FaultError(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}") from None
