"""The simulated Proxmox side: the container's ``/etc/pve/lxc/<ctid>.conf`` and what `pct start`
makes of it.

A container's device cgroup and its ``/dev/nvidia-uvm`` node are set ONLY when the container
starts (at boot, or by ``pct start``), from the conf file as it is then:

* ``lxc.cgroup2.devices.allow: c M:N rwm`` (and the v1 ``lxc.cgroup.devices.allow``) lines become
  the allow-list, after LXC's default rules;
* ``lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file`` bind-mounts
  the hypervisor's node as it is at that moment (skipped silently when the node is missing);
* ``devN: /dev/nvidia-uvm`` passes the node through AND allows its current major.
"""

from __future__ import annotations

import re

#: rules LXC puts in every container's device cgroup (null, zero, full, urandom, random, tty,
#: console, ptmx, pts, fuse, mknod of anything)
LXC_DEFAULT_RULES = [
    "c *:* m", "b *:* m", "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
    "c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 136:* rwm", "c 10:229 rwm",
]

_ALLOW = re.compile(r"^\s*lxc\.cgroup2?\.devices\.allow\s*[:=]\s*(.+?)\s*$")
_MOUNT = re.compile(r"^\s*lxc\.mount\.entry\s*[:=]\s*(\S+)\s+(\S+)\s+\S+\s+(\S+)")
_DEV = re.compile(r"^\s*dev\d+\s*:\s*([^,\s]+)")


def conf_text(name: str, ctid: int, uvm_major: int, gpu_count: int) -> str:
    lines = [
        f"# simulated Proxmox VE container {name}",
        "arch: amd64",
        "cores: 96",
        "features: nesting=1",
        f"hostname: {name}",
        "memory: 786432",
        "net0: name=eth0,bridge=vmbr0,firewall=1,ip=dhcp,type=veth",
        "onboot: 1",
        "ostype: debian",
        f"rootfs: local-zfs:subvol-{ctid}-disk-0,size=4000G",
        "swap: 0",
        "unprivileged: 1",
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        f"lxc.cgroup2.devices.allow: c {uvm_major}:* rwm",
    ]
    nodes = [f"nvidia{i}" for i in range(gpu_count)] + [
        "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"]
    lines += [f"lxc.mount.entry: /dev/{n} dev/{n} none bind,optional,create=file" for n in nodes]
    return "\n".join(lines) + "\n"


def parse_conf(text: str) -> dict:
    """{"allow": [rules], "uvm_mount": bool, "uvm_dev": bool} from a container conf."""
    allow: list[str] = []
    uvm_mount = uvm_dev = False
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ALLOW.match(line)
        if m:
            allow.append(" ".join(m.group(1).split()))
            continue
        m = _MOUNT.match(line)
        if m and m.group(1) == "/dev/nvidia-uvm" and "bind" in m.group(3):
            uvm_mount = True
            continue
        m = _DEV.match(line)
        if m and m.group(1) == "/dev/nvidia-uvm":
            uvm_dev = True
    return {"allow": allow, "uvm_mount": uvm_mount, "uvm_dev": uvm_dev}


def start_container(state: dict, conf: str) -> None:
    """Set the container's cgroup allow-list and uvm node from `conf`, as a start does."""
    parsed = parse_conf(conf)
    host_node = state["kernel"].get("host_node_major")
    rules = list(LXC_DEFAULT_RULES) + parsed["allow"]
    node = None
    if host_node is not None and (parsed["uvm_mount"] or parsed["uvm_dev"]):
        node = int(host_node)
    if parsed["uvm_dev"] and node is not None:
        rules += [f"c {node}:0 rwm", f"c {node}:1 rwm"]
    state["container"].update({"running": True, "node_major": node, "allow": rules})


def stop_container(state: dict) -> None:
    state["container"]["running"] = False
    state["allocations"] = {}


def drop_uvm_allow(conf: str, majors: set[int]) -> str:
    """The conf without the allow lines of the given majors (the `uvm-cgroup` fault)."""
    out = []
    for line in conf.splitlines():
        m = _ALLOW.match(line)
        if m:
            parts = m.group(1).split()
            if len(parts) >= 2 and parts[1].split(":")[0] in {str(x) for x in majors}:
                continue
        out.append(line)
    return "\n".join(out) + "\n"


def add_uvm_allow(conf: str, major: int) -> str:
    """The conf with an allow line for `major` (after the 195 line) unless one is there."""
    lines = conf.splitlines()
    for line in lines:
        m = _ALLOW.match(line)
        if m and len(m.group(1).split()) >= 2 and m.group(1).split()[1].startswith(f"{major}:"):
            return conf
    new = f"lxc.cgroup2.devices.allow: c {major}:* rwm"
    for i, line in enumerate(lines):
        if _ALLOW.match(line):
            lines.insert(i + 1, new)
            break
    else:
        lines.append(new)
    return "\n".join(lines) + "\n"


def rules_without(rules: list[str] | None, majors: set[int]) -> list[str]:
    base = list(LXC_DEFAULT_RULES) + ["c 195:* rwm"] if rules is None else list(rules)
    return [r for r in base if not (len(r.split()) >= 2 and r.split()[0] == "c"
                                    and r.split()[1].split(":")[0] in {str(m) for m in majors})]
