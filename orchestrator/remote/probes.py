"""The registry of what the agent serves ON the host (stdlib only, Python 3.8+): probes and actions.

A probe only reads; an action changes the host. Each is a function registered by name that
returns a JSON-able value:

    @probe("disk_free")
    def disk_free(path: str = "/") -> dict: ...

    @action("server_stop")          # in orchestrator/remote/actions.py
    def server_stop(state_dir: str, grace: float = 60.0) -> dict: ...

The client calls a probe with `transport.probe("disk_free", path="/data")` and an action with
`transport.act("server_stop", ...)` (stages: `Host.act`, which refuses after Ctrl-C). The agent
serves each only through its own operation: an action sent as a probe is refused, so a check can
never change the host by mistake. Probes read real paths (/proc, /sys, /dev, /etc) with plain
open()/os.stat, so tests can run them on any Linux box and against recorded files by passing a
different path argument.

Adding probes: add a function here, or a new module in `orchestrator/remote/` that does
`from orchestrator.remote.probes import probe` (every module of that folder is shipped with the
agent and importable there under the same name). Actions live in `orchestrator/remote/actions.py`.
Keep them stdlib-only and Python 3.8 compatible; raise an exception to report a failure (the
client gets a TransportError with its message).

`module_source(name)` is the text of another module of this folder, on the host (the shipped copy)
as here (the file): programs run by another python (the supervisor, the CUDA init check) are
modules of this folder, sent or written by their text.
"""
from __future__ import annotations

import importlib
import os
import stat
import sys
from collections.abc import Callable

PROBES = {}  # type: dict  # name -> function that only reads
ACTIONS = {}  # type: dict  # name -> function that changes the host


def _register(table: dict, kind: str, name: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        if (table.get(name, fn) is not fn or (PROBES if table is ACTIONS else ACTIONS).get(
                name) is not None):
            raise ValueError(f"{kind} {name!r} is defined twice")
        table[name] = fn
        return fn

    return register


def probe(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as the probe `name` (it must only read)."""
    return _register(PROBES, "probe", name)


def action(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as the action `name` (it changes the host)."""
    return _register(ACTIONS, "action", name)


def module_source(name: str) -> str:
    """The source text of orchestrator/remote/NAME.py (on the host: the copy the agent got)."""
    full = "orchestrator.remote." + name
    mod = importlib.import_module(full)
    text = mod.__loader__.get_source(full) if mod.__loader__ is not None else None
    if text is None:
        raise ImportError(f"no source for {full}")
    return text


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
        # platform.python_implementation()'s names (CPython 3.11 Lib/platform.py:1062-1081),
        # without importing platform (~2 ms here)
        "implementation": {"cpython": "CPython", "pypy": "PyPy"}.get(
            sys.implementation.name, sys.implementation.name),
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


@probe("tensor_names")
def tensor_names(path: str, wanted: list) -> dict:
    """Which of the `wanted` substrings a checkpoint's tensor names contain: from
    model.safetensors.index.json's weight_map, else the header of model.safetensors (its
    first 8 bytes give the header's length; the header is JSON). `source` None: neither."""
    import json
    import struct

    base = os.path.expanduser(path).rstrip("/")
    names = None
    source = None
    try:
        with open(base + "/model.safetensors.index.json", encoding="utf-8") as fh:
            names = list((json.load(fh).get("weight_map") or {}).keys())
            source = "index"
    except (OSError, ValueError, AttributeError):
        try:
            with open(base + "/model.safetensors", "rb") as fh:
                (length,) = struct.unpack("<Q", fh.read(8))
                if length > 64 * 1024 * 1024:
                    raise ValueError("header too large")
                names = [k for k in json.loads(fh.read(length)) if k != "__metadata__"]
                source = "header"
        except (OSError, ValueError, struct.error):
            names = None
    found = {w: any(w in n for n in names) for w in wanted} if names is not None else {}
    return {"path": path, "source": source, "found": found}


@probe("boot_id")
def boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> dict:
    """The kernel's boot id: changes at every boot, so a run can tell the host rebooted."""
    from orchestrator.remote.supervisor import boot_id as read_boot_id

    return {"boot_id": read_boot_id(path)}


@probe("env")
def env_var(var: str) -> dict:
    """The value of environment variable `var` in the agent's environment (None if unset)."""
    return {"var": var, "value": os.environ.get(var)}
