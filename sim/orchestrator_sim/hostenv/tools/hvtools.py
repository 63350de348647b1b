"""Hypervisor commands of a simulated Proxmox host: ``pct``, ``nvidia-modprobe``, ``mknod``.

``pct start`` is the ONLY thing that re-reads ``/etc/pve/lxc/<ctid>.conf`` into the container's
device cgroup (the daemon does it, through the control channel); ``pct stop`` kills every process
of the container and drops its SSH endpoint until the next start.
"""

# ruff: noqa: UP031  (host-side code keeps printf-style formatting for its tables)

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "site"))
sys.path.insert(0, _HERE)

import simctl  # noqa: E402
import simhw  # noqa: E402

_PCT_USAGE = """\
USAGE: pct <COMMAND> [ARGS] [OPTIONS]
       pct list
       pct config <vmid>
       pct status <vmid>
       pct start <vmid>
       pct stop <vmid>
       pct shutdown <vmid>
       pct reboot <vmid>
"""


def _conf_path(ctid: int) -> str:
    return os.path.join(simhw.host_root(), "etc", "pve", "lxc", "%d.conf" % ctid)


def _ctid(arg: str, state: dict) -> int:
    try:
        ctid = int(arg)
    except ValueError:
        raise SystemExit("400 Parameter verification failed.\nvmid: type check ('integer') "
                         "failed - got '%s'\npct <command> <vmid>" % arg) from None
    if ctid != int(state.get("ctid", -1)) or not os.path.exists(_conf_path(ctid)):
        sys.stderr.write("Configuration file 'nodes/%s/lxc/%d.conf' does not exist\n"
                         % (os.environ.get("SIM_HOST_NAME", "pve"), ctid))
        raise SystemExit(255)
    return ctid


def pct(argv: list) -> int:
    if not argv or argv[0] in ("help", "-h", "--help"):
        sys.stdout.write(_PCT_USAGE)
        return 0 if argv else 255
    if simhw.role() != simhw.ROLE_HYPERVISOR:
        sys.stderr.write("pct: this is not a Proxmox VE host\n")
        return 255
    cmd, args = argv[0], argv[1:]
    state = simhw.read_state()
    if cmd == "list":
        running = state.get("container", {}).get("running", False)
        sys.stdout.write("VMID       Status     Lock         Name                \n")
        sys.stdout.write("%-10d %-10s %-12s %-20s\n" % (int(state["ctid"]),
                         "running" if running else "stopped", "", state.get("box", "")))
        return 0
    if not args:
        sys.stderr.write("400 not enough arguments\npct %s <vmid>\n" % cmd)
        return 255
    ctid = _ctid(args[0], state)
    if cmd == "status":
        running = state.get("container", {}).get("running", False)
        sys.stdout.write("status: %s\n" % ("running" if running else "stopped"))
        return 0
    if cmd == "config":
        with open(_conf_path(ctid), encoding="utf-8") as f:
            for line in f:
                if line.strip() and not line.lstrip().startswith("#"):
                    sys.stdout.write(line if line.endswith("\n") else line + "\n")
        return 0
    ops = {"start": "container_start", "stop": "container_stop", "shutdown": "container_stop",
           "reboot": "container_reboot"}
    if cmd not in ops:
        sys.stderr.write("unknown command 'pct %s'\n" % cmd)
        return 255
    try:
        host, port, token = simctl.from_env()
        answer = simctl.request((host, port), token, ops[cmd], ctid=ctid,
                                hypervisor=os.environ.get("SIM_HOST_NAME", ""))
    except simctl.ControlError as exc:
        sys.stderr.write("pct: %s\n" % exc)
        return 255
    if not answer.get("ok"):
        sys.stderr.write(str(answer.get("error", "failed")) + "\n")
        return 255
    return 0


def nvidia_modprobe(argv: list) -> int:
    """``nvidia-modprobe [-u] [-c=N]``: load the module(s) and create the device nodes."""
    who = simhw.role()
    if who == simhw.ROLE_CONTAINER:
        return 1  # an unprivileged container cannot load modules nor mknod: silent failure
    want_uvm = "-u" in argv or "--unified-memory" in argv

    def apply(state: dict) -> None:
        kernel = state.setdefault("kernel", {})
        if want_uvm:
            if not kernel.get("uvm_loaded", True):
                kernel["uvm_loaded"] = True
                simhw.log_kernel(state, "nvidia-uvm: Loaded the UVM driver, major device "
                                 "number %d." % int(kernel["uvm_major"]))
            kernel["host_node_major"] = int(kernel["uvm_major"])

    simhw.update(apply)
    return 0


def mknod(argv: list) -> int:
    """mknod for /dev/nvidia-uvm* on the hypervisor; anything else goes to the real mknod."""
    args = [a for a in argv if a not in ("-m",)]
    paths = [a for a in argv if a.startswith("/dev/nvidia-uvm")]
    if not paths or simhw.role() == simhw.ROLE_CONTAINER:
        real = "/usr/bin/mknod" if os.path.exists("/usr/bin/mknod") else "/bin/mknod"
        os.execv(real, [real] + argv)
    try:
        i = args.index(paths[0])
        kind, major, minor = args[i + 1], int(args[i + 2]), int(args[i + 3])
    except (ValueError, IndexError):
        sys.stderr.write("mknod: missing operand\n")
        return 1
    if kind != "c":
        sys.stderr.write("mknod: only character devices are simulated\n")
        return 1

    def apply(state: dict) -> int:
        kernel = state.setdefault("kernel", {})
        if paths[0] == "/dev/nvidia-uvm" and minor == 0:
            if kernel.get("host_node_major") is not None:
                return 1
            kernel["host_node_major"] = major
        return 0

    if simhw.update(apply):
        sys.stderr.write("mknod: %s: File exists\n" % paths[0])
        return 1
    return 0


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tool, rest = argv[0], argv[1:]
    return {"pct": pct, "nvidia-modprobe": nvidia_modprobe, "mknod": mknod}[tool](rest)


if __name__ == "__main__":
    sys.exit(main())
