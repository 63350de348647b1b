"""Named fact probes shipped with the agent and run ON the host (stdlib only, Python 3.8+).

A probe is a function registered by name that returns a JSON-able value:

    @probe("disk_free")
    def disk_free(path: str = "/") -> dict: ...

The client calls it with `transport.probe("disk_free", path="/data")`. Probes read real paths
(/proc, /sys, /dev, /etc) with plain open()/os.stat, so tests can run them on any Linux box and
against recorded files by passing a different path argument.

Adding probes: add a function here, or a new module in `orchestrator/remote/` that does
`from orchestrator.remote.probes import probe` (every module of that folder is shipped with the
agent and imported after this one; on the host they live under the same names). Keep them
stdlib-only and Python 3.8 compatible; raise an exception to report a failure (the client gets
a TransportError with its message).
"""

from __future__ import annotations

import os
import platform
import stat
import sys

PROBES = {}  # type: dict


def probe(name: str):
    """Register the decorated function as the probe `name`."""

    def register(fn):
        if name in PROBES and PROBES[name] is not fn:
            raise ValueError(f"probe {name!r} is defined twice")
        PROBES[name] = fn
        return fn

    return register


def _parse_os_release(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


@probe("python")
def python_info() -> dict:
    """The Python running the agent: version and executable."""
    return {
        "version": ".".join(map(str, sys.version_info[:3])),
        "version_info": list(sys.version_info[:3]),
        "executable": sys.executable,
        "implementation": platform.python_implementation(),
    }


@probe("os")
def os_info(os_release: str = "/etc/os-release") -> dict:
    """uname fields and the parsed os-release file (None when absent)."""
    u = os.uname()
    release = None
    paths = [os_release]
    if os_release == "/etc/os-release":
        paths.append("/usr/lib/os-release")  # the fallback os-release(5) names
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                release = _parse_os_release(fh.read())
            break
        except OSError:
            continue
    return {
        "sysname": u.sysname, "nodename": u.nodename, "release": u.release,
        "version": u.version, "machine": u.machine, "os_release": release,
    }


@probe("disk_free")
def disk_free(path: str = "/") -> dict:
    """Free and total bytes of the filesystem holding `path` (its nearest existing parent)."""
    target = os.path.abspath(os.path.expanduser(path))
    probe_path = target
    while not os.path.exists(probe_path) and probe_path != os.path.dirname(probe_path):
        probe_path = os.path.dirname(probe_path)
    st = os.statvfs(probe_path)
    return {
        "path": target,
        "checked_path": probe_path,
        "free": st.f_bavail * st.f_frsize,
        "total": st.f_blocks * st.f_frsize,
        "free_inodes": st.f_favail,
    }


@probe("path")
def path_info(path: str) -> dict:
    """Whether `path` exists, its type, size, permission bits, owner and device numbers."""
    p = os.path.expanduser(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    except NotADirectoryError:
        return {"path": path, "exists": False}
    out = {
        "path": path,
        "exists": True,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "is_file": stat.S_ISREG(st.st_mode),
        "is_link": os.path.islink(p),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "mtime": st.st_mtime,
    }
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        out["char_device"] = stat.S_ISCHR(st.st_mode)
        out["major"] = os.major(st.st_rdev)
        out["minor"] = os.minor(st.st_rdev)
    return out


@probe("env")
def env_var(var: str) -> dict:
    """The value of environment variable `var` in the agent's environment (None if unset)."""
    return {"var": var, "value": os.environ.get(var)}
