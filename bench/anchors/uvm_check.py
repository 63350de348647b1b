"""The anchors' nvidia-uvm / cgroup / CUDA / shm check: `python3 -c TEXT MIN_SHM_GIB` on the host.

Stdlib only, Python 3.8+. Every anchor tool (Ansible, pyinfra, Fabric) sends this file's text,
so the three run the same host-side check; it mirrors what our `host_health` stage reads through
the `uvm_facts` and `shm_facts` probes (orchestrator/remote/gpu.py):

* the kernel's nvidia-uvm major from /proc/devices;
* /dev/nvidia-uvm: a character device whose major is that one;
* the device cgroup: cgroup v1 devices.list must allow it (v2 has no readable list; the open
  below is what tells there, EPERM);
* open("/dev/nvidia-uvm", O_RDWR) succeeds;
* cuInit(0) returns 0 (libcuda.so.1; on a simulated host without libcuda, the simulator's
  `simhw`, exactly as orchestrator/remote/cuda_init.py does);
* /dev/shm is at least MIN_SHM_GIB large.

On the simulated hosts /dev/nvidia-uvm, /proc/devices and /dev/shm exist only for Python (the
simulator's sitecustomize), so a shell `stat` would not see them: that is why this is Python.
Prints one JSON line; exits 1 (naming each problem on stderr) when anything is wrong.
"""

import ctypes
import errno
import json
import os
import stat
import sys

UVM = "/dev/nvidia-uvm"
GIB = 1024**3


def uvm_major():
    """The nvidia-uvm character major registered by the kernel, or None."""
    section = None
    with open("/proc/devices", encoding="utf-8") as f:
        for line in f:
            text = line.strip().lower()
            if text.startswith("character devices"):
                section = "char"
            elif text.startswith("block devices"):
                section = "block"
            elif section == "char":
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[1].strip() == "nvidia-uvm":
                    return int(parts[0])
    return None


def cgroup_allows(major, minor):
    """cgroup v1: do the devices.list rules allow rw on c MAJOR:MINOR? None under v2."""
    try:
        with open("/sys/fs/cgroup/devices/devices.list", encoding="utf-8") as f:
            rules = [line.split() for line in f if line.strip()]
    except OSError:
        return None
    for rule in rules:
        kind = rule[0]
        where = rule[1] if len(rule) > 1 else "*:*"
        access = rule[2] if len(rule) > 2 else "rwm"
        if "r" not in access or "w" not in access:
            continue
        if kind == "a":
            return True
        rmaj, _, rmin = where.partition(":")
        if kind == "c" and rmaj in ("*", str(major)) and rmin in ("*", str(minor)):
            return True
    return False


def cuda_init():
    """cuInit(0): (code, source)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        try:
            import simhw
        except ImportError:
            return None, "no libcuda.so.1"
        return int(simhw.cuda_init()), "simhw"
    return int(lib.cuInit(0)), "libcuda"


def main():
    """Check, print the answer, exit 1 on any problem."""
    min_shm_gib = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    problems = []
    out = dict(proc_major=None, node_major=None, cgroup_allows=None, open_ok=False,
               cuda_init=None, shm_gib=None)
    try:
        out["proc_major"] = uvm_major()
    except OSError as exc:
        problems.append(f"/proc/devices: {exc}")
    if out["proc_major"] is None:
        problems.append("nvidia-uvm is not registered in /proc/devices (module not loaded)")
    minor = 0
    try:
        st = os.stat(UVM)
    except OSError as exc:
        problems.append(f"{UVM}: {exc.strerror}")
    else:
        if not stat.S_ISCHR(st.st_mode):
            problems.append(f"{UVM} is not a character device")
        else:
            out["node_major"], minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            if out["proc_major"] is not None and out["node_major"] != out["proc_major"]:
                problems.append(f"{UVM} has major {out['node_major']}, the kernel's is "
                                f"{out['proc_major']}")
    major = out["node_major"] if out["node_major"] is not None else out["proc_major"]
    if major is not None:
        out["cgroup_allows"] = cgroup_allows(major, minor)
        if out["cgroup_allows"] is False:
            problems.append(f"the device cgroup does not allow c {major}:{minor} rw")
    try:
        os.close(os.open(UVM, os.O_RDWR))
        out["open_ok"] = True
    except OSError as exc:
        problems.append(f"open({UVM}, O_RDWR): {errno.errorcode.get(exc.errno, exc)}")
    code, source = cuda_init()
    out["cuda_init"] = code
    if code != 0:
        problems.append(f"cuInit(0) returned {code} ({source})")
    try:
        sv = os.statvfs("/dev/shm")
        out["shm_gib"] = round(sv.f_blocks * sv.f_frsize / GIB, 1)
        if out["shm_gib"] < min_shm_gib:
            problems.append(f"/dev/shm is {out['shm_gib']} GiB, {min_shm_gib} needed")
    except OSError as exc:
        problems.append(f"/dev/shm: {exc}")
    print(json.dumps(out))
    for p in problems:
        sys.stderr.write(f"uvm_check: {p}\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
