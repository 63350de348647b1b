"""Point a few hardware paths of a simulated host at the simulated hardware (stdlib, 3.8+).

Loaded by every Python process started on a simulated host (the host's site dir is on
PYTHONPATH). It patches builtins.open/io.open and os.open/stat/lstat/access/listdir/scandir/
statvfs/rename/replace/unlink/remove/mkdir/rmdir/chmod/utime so that ONLY these paths change:

* ``/proc/devices``, ``/proc/driver/nvidia/version``, ``/proc/sys/kernel/random/boot_id``,
  ``/sys/fs/cgroup/devices/devices.list`` (cgroup v1 only; absent under v2): text made from the
  box's state;
* ``/dev/nvidia0..N``, ``/dev/nvidiactl``, ``/dev/nvidia-modeset``, ``/dev/nvidia-uvm``,
  ``/dev/nvidia-uvm-tools``: character devices with the simulated major/minor; opening one fails
  with EPERM when the device cgroup does not allow its major (ENXIO when no driver answers it);
* ``os.statvfs('/dev/shm')`` reports the simulated shm size; ``os.statvfs`` of the host's root
  (and ``/``) reports the box's disk (``disk_gib`` in the state, 3840 by default) less what is
  really used underneath, and almost no free space with the ``disk-full`` fault;
* ``/var/log/...`` is the host's ROOT/var/log/..., and on a hypervisor ``/etc/pve/...`` is
  ROOT/etc/pve/...

Everything else passes through untouched. Shell tools (cat, stat, ls) are NOT redirected: the
product reads host files through its Python agent. With ``no-pip`` set, ``ensurepip`` cannot be
imported and ``python3 -m venv DIR`` fails as on Debian without python3-venv.
"""

# ruff: noqa: UP031  (host-side code keeps printf-style formatting for its tables)

from __future__ import annotations

import builtins
import errno as _errno
import io
import os
import posixpath
import stat as _stat
import sys

_STATE = os.environ.get("SIM_HOST_STATE")
_ROOT = os.environ.get("SIM_HOST_ROOT", "")
_ROLE = os.environ.get("SIM_HOST_ROLE", "container")

_real = {
    "open": builtins.open,
    "io_open": io.open,
    "os_open": os.open,
    "stat": os.stat,
    "lstat": os.lstat,
    "access": os.access,
    "listdir": os.listdir,
    "scandir": os.scandir,
    "statvfs": os.statvfs,
    "rename": os.rename,
    "replace": os.replace,
    "unlink": os.unlink,
    "remove": os.remove,
    "mkdir": os.mkdir,
    "rmdir": os.rmdir,
    "chmod": os.chmod,
    "utime": os.utime,
}

_PREFIXES = ("/dev/", "/proc/", "/sys/", "/etc/pve", "/var/log")
_TEXT_FILES = (
    "/proc/devices",
    "/proc/driver/nvidia/version",
    "/proc/sys/kernel/random/boot_id",
    "/sys/fs/cgroup/devices/devices.list",
)
_hw = None


def _simhw():
    global _hw
    if _hw is None:
        import simhw  # noqa: PLC0415  (lazy: only processes touching hardware pay for it)

        _hw = simhw
    return _hw


def _is_node_name(name: str) -> bool:
    if not name.startswith("nvidia"):
        return False
    rest = name[6:]
    return rest.isdigit() or rest in ("ctl", "-modeset", "-uvm", "-uvm-tools")


def _path_str(path):
    """(normalized absolute str path, was_bytes) or (None, False) for anything not absolute."""
    if isinstance(path, int):
        return None, False
    try:
        p = os.fspath(path)
    except TypeError:
        return None, False
    was_bytes = isinstance(p, bytes)
    if was_bytes:
        p = os.fsdecode(p)
    if not p.startswith("/"):
        return None, False
    if "/." in p or "//" in p:
        p = posixpath.normpath(p)
    return p, was_bytes


def _classify(path):
    """None (pass through) or ("redirect", newpath) / ("text", str|None) / ("node", (M, m)|None).

    With the box state unreadable (simulator gone) everything passes through.
    """
    try:
        return _classify_hw(path)
    except _simhw().SimHWError:
        return None


def _classify_hw(path):
    p, was_bytes = _path_str(path)
    if p is None or not p.startswith(_PREFIXES):
        return None
    if p.startswith("/dev/"):
        name = p[5:]
        if "/" in name or not _is_node_name(name):
            return None
        hw = _simhw()
        return ("node", hw.device_nodes(hw.read_state(), _ROLE).get(p))
    if p in _TEXT_FILES:
        hw = _simhw()
        state = hw.read_state()
        if p == "/proc/devices":
            return ("text", hw.proc_devices_text(state))
        if p == "/proc/driver/nvidia/version":
            return ("text", hw.driver_version_text(state))
        if p == "/proc/sys/kernel/random/boot_id":
            return ("text", hw.boot_id(state) + "\n")
        return ("text", hw.devices_list_text(state))
    target = None
    if _ROOT and (p == "/var/log" or p.startswith("/var/log/")):
        target = _ROOT + p
    elif _ROOT and _ROLE == "hypervisor" and (p == "/etc/pve" or p.startswith("/etc/pve/")):
        target = _ROOT + p
    if target is None:
        return None
    return ("redirect", os.fsencode(target) if was_bytes else target)


def _enoent(path):
    return FileNotFoundError(_errno.ENOENT, os.strerror(_errno.ENOENT), path)


def _oserror(code, path):
    return OSError(code, os.strerror(code), path)


def _memfd(text: str) -> int:
    data = text.encode("utf-8")
    fd = os.memfd_create("simhw", 0)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _writes(mode) -> bool:
    return any(c in str(mode) for c in "wax+")


def _node_errno(path_str):
    hw = _simhw()
    return hw.open_errno(hw.read_state(), path_str, _ROLE)


def _open(file, mode="r", *args, **kwargs):
    c = _classify(file)
    if c is None:
        return _real["open"](file, mode, *args, **kwargs)
    kind, value = c
    if kind == "redirect":
        return _real["open"](value, mode, *args, **kwargs)
    if value is None:
        raise _enoent(file)
    if kind == "text":
        if _writes(mode):
            raise _oserror(_errno.EACCES, file)
        kwargs.pop("closefd", None)
        kwargs.pop("opener", None)
        return _real["open"](_memfd(value), mode, *args, **kwargs)
    code = _node_errno(_path_str(file)[0])
    if code is not None:
        raise _oserror(code, file)
    return _real["open"]("/dev/null", mode, *args, **kwargs)


def _os_open(path, flags, mode=0o777, *, dir_fd=None):
    c = _classify(path) if dir_fd is None else None
    if c is None:
        return _real["os_open"](path, flags, mode, dir_fd=dir_fd)
    kind, value = c
    if kind == "redirect":
        return _real["os_open"](value, flags, mode)
    if value is None:
        raise _enoent(path)
    if kind == "text":
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND):
            raise _oserror(_errno.EACCES, path)
        return _memfd(value)
    code = _node_errno(_path_str(path)[0])
    if code is not None:
        raise _oserror(code, path)
    return _real["os_open"]("/dev/null", flags, mode)


def _fake_stat(kind, value, path):
    now = int(_real["stat"]("/proc/self").st_mtime)
    if kind == "text":
        size = 0 if path.startswith("/proc/") else 4096
        return os.stat_result((_stat.S_IFREG | 0o444, 4026531842, 22, 1, 0, 0, size, now, now, now))
    major, minor = value
    ino = 1000 + major * 256 + minor
    return os.stat_result(
        (_stat.S_IFCHR | 0o666, ino, 5, 1, 0, 0, 0, now, now, now),
        {"st_rdev": os.makedev(major, minor)},
    )


def _make_stat(real_name):
    real = _real[real_name]

    def _stat_fn(path, *, dir_fd=None, follow_symlinks=True):
        c = _classify(path) if dir_fd is None else None
        if c is None:
            return real(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks) \
                if real_name == "stat" else real(path, dir_fd=dir_fd)
        kind, value = c
        if kind == "redirect":
            return real(value)
        if value is None:
            raise _enoent(path)
        return _fake_stat(kind, value, _path_str(path)[0])

    _stat_fn.__name__ = real_name
    return _stat_fn


def _access(path, mode, *, dir_fd=None, effective_ids=False, follow_symlinks=True):
    c = _classify(path) if dir_fd is None else None
    if c is None:
        return _real["access"](path, mode, dir_fd=dir_fd, effective_ids=effective_ids,
                               follow_symlinks=follow_symlinks)
    kind, value = c
    if kind == "redirect":
        return _real["access"](value, mode)
    if value is None:
        return False
    if kind == "text" and mode & os.W_OK:
        return False
    return True


class _FakeEntry:
    """A DirEntry stand-in for a simulated /dev/nvidia* node."""

    def __init__(self, name, was_bytes):
        self._path = "/dev/" + name
        self.name = os.fsencode(name) if was_bytes else name
        self.path = os.fsencode(self._path) if was_bytes else self._path

    def inode(self):
        return _stat_patched(self._path).st_ino

    def is_dir(self, *, follow_symlinks=True):
        return False

    def is_file(self, *, follow_symlinks=True):
        return False

    def is_symlink(self):
        return False

    def is_junction(self):
        return False

    def stat(self, *, follow_symlinks=True):
        return _stat_patched(self._path)

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return "<DirEntry %r>" % (self.name,)


class _ScandirIter:
    """What os.scandir('/dev') returns on a simulated host: real entries plus the fake nodes."""

    def __init__(self, entries):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._it = iter(())


def _dev_names():
    hw = _simhw()
    try:
        return sorted(p[5:] for p in hw.device_nodes(hw.read_state(), _ROLE))
    except hw.SimHWError:
        return None


def _listdir(path="."):
    p, was_bytes = _path_str(path)
    extra = _dev_names() if p == "/dev" else None
    if extra is not None:
        real = [n for n in _real["listdir"](path) if not _is_node_name(os.fsdecode(n))]
        return real + ([os.fsencode(n) for n in extra] if was_bytes else extra)
    c = _classify(path)
    if c is not None and c[0] == "redirect":
        return _real["listdir"](c[1])
    return _real["listdir"](path)


def _scandir(path="."):
    p, was_bytes = _path_str(path)
    names = _dev_names() if p == "/dev" else None
    if names is not None:
        with _real["scandir"](path) as it:
            entries = [e for e in it if not _is_node_name(os.fsdecode(e.name))]
        entries += [_FakeEntry(n, was_bytes) for n in names]
        return _ScandirIter(entries)
    c = _classify(path)
    if c is not None and c[0] == "redirect":
        return _real["scandir"](c[1])
    return _real["scandir"](path)


def _under(p, top):
    return p == top or p.startswith(top.rstrip("/") + "/")


def _statvfs(path):
    try:
        return _statvfs_hw(path)
    except _simhw().SimHWError:
        return _real["statvfs"](path)


def _statvfs_hw(path):
    p, _ = _path_str(path)
    if p is None or not _STATE:
        return _real["statvfs"](path)
    if _under(p, "/dev/shm"):
        mib = _simhw().shm_mib()
        blocks = mib * 256  # 4 KiB blocks
        return os.statvfs_result((4096, 4096, blocks, blocks, blocks, 1 << 20, 1 << 20,
                                  1 << 20, 6, 255))
    if p.startswith(("/proc", "/sys", "/dev")):
        return _real["statvfs"](path)
    c = _classify(path)
    real = _real["statvfs"](c[1] if c and c[0] == "redirect" else path)
    if (_ROOT and _under(p, _ROOT)) or p == "/" or (c and c[0] == "redirect"):
        # The box's own disk: its simulated size, less what is really used underneath.
        blocks = _simhw().disk_gib() * (1 << 30) // real.f_frsize
        free = max(0, blocks - (real.f_blocks - real.f_bfree))
        full = _simhw().fault("disk-full")
        if full is not None:
            free = int(full.get("free_mib", 100)) * 1024 * 1024 // real.f_frsize
        return os.statvfs_result((real.f_bsize, real.f_frsize, blocks, free, free,
                                  real.f_files, real.f_ffree, real.f_favail, real.f_flag,
                                  real.f_namemax))
    return real


def _redirect_only(real_name, npaths=1):
    real = _real[real_name]

    def fn(*args, **kwargs):
        if kwargs.get("dir_fd") is None and kwargs.get("src_dir_fd") is None:
            args = list(args)
            for i in range(min(npaths, len(args))):
                c = _classify(args[i])
                if c is not None:
                    if c[0] != "redirect":
                        raise _oserror(_errno.EPERM if c[1] is not None else _errno.ENOENT,
                                       args[i])
                    args[i] = c[1]
        return real(*args, **kwargs)

    fn.__name__ = real_name
    return fn


# ------------------------------------------------------------------------------- no-pip fault

_DEBIAN_VENV_MESSAGE = """\
The virtual environment was not created successfully because ensurepip is not
available.  On Debian/Ubuntu systems, you need to install the python3-venv
package using the following command.

    apt install python%d.%d-venv

You may need to use sudo with that command.  After installing the python3-venv
package, recreate your virtual environment.

Failing command: %s
"""


def _no_pip() -> bool:
    try:
        return _simhw().fault("no-pip") is not None
    except Exception:
        return False


class _BlockEnsurepip:
    """Meta-path finder: `ensurepip` is not installed while the no-pip fault is on."""

    def find_spec(self, name, path=None, target=None):
        if (name == "ensurepip" or name.startswith("ensurepip.")) and _no_pip():
            raise ModuleNotFoundError("No module named %r" % name, name=name)
        return None


def _patch_venv() -> None:
    import venv  # noqa: PLC0415

    def _setup_pip(self, context):
        sys.stdout.write(_DEBIAN_VENV_MESSAGE % (sys.version_info[0], sys.version_info[1],
                                                 context.env_exec_cmd))
        sys.stdout.flush()
        raise SystemExit(1)

    venv.EnvBuilder._setup_pip = _setup_pip


def _module_arg(argv):
    for i, a in enumerate(argv[1:], 1):
        if a == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("-m") and len(a) > 2:
            return a[2:]
        if a in ("-c",) or not a.startswith("-"):
            return None
    return None


def _install() -> None:
    builtins.open = _open
    io.open = _open
    os.open = _os_open
    os.stat = _stat_patched
    os.lstat = _make_stat("lstat")
    os.access = _access
    os.listdir = _listdir
    os.scandir = _scandir
    os.statvfs = _statvfs
    os.rename = _redirect_only("rename", 2)
    os.replace = _redirect_only("replace", 2)
    os.unlink = _redirect_only("unlink")
    os.remove = _redirect_only("remove")
    os.mkdir = _redirect_only("mkdir")
    os.rmdir = _redirect_only("rmdir")
    os.chmod = _redirect_only("chmod")
    os.utime = _redirect_only("utime")
    # keep os.supports_* truthful for the wrappers (shutil.rmtree checks them)
    for name in ("open", "stat", "lstat", "access", "listdir", "scandir", "statvfs", "rename",
                 "replace", "unlink", "remove", "mkdir", "rmdir", "chmod", "utime"):
        real = _real["os_open" if name == "open" else name]
        for group in ("supports_dir_fd", "supports_fd", "supports_follow_symlinks",
                      "supports_effective_ids"):
            table = getattr(os, group, None)
            if table is not None and real in table:
                table.add(getattr(os, name))
    sys.meta_path.insert(0, _BlockEnsurepip())
    argv = list(getattr(sys, "orig_argv", []) or [])
    module = _module_arg(argv)
    if module == "venv" and "--without-pip" not in argv and _no_pip():
        _patch_venv()
    elif module == "ensurepip" and _no_pip():
        sys.stderr.write("%s: No module named ensurepip\n" % sys.executable)
        sys.stderr.flush()
        os._exit(1)


_stat_patched = _make_stat("stat")

if _STATE:
    try:
        _install()
    except Exception as _exc:  # never break the host's python
        sys.stderr.write("simulated host: sitecustomize failed: %r\n" % (_exc,))
