"""Host-side facts about Python virtual environments (stdlib only, Python 3.8+).

Probe ``venv_state(path)``: what is at ``path`` (nothing, a file, an empty folder, a venv, a
half-created venv, something else), read with plain os calls so it works the same on any host.
Used by the ``python_venv`` stage kind to decide between create, repair and recreate.
"""

from __future__ import annotations

import os
import sys

try:  # shipped with the agent: registered as a probe there
    from orchestrator.remote.probes import probe
except ImportError:  # pragma: no cover - imported on its own

    def probe(name):  # type: ignore[no-redef]
        """No-op stand-in when the probe registry is not available."""
        return lambda fn: fn


#: what `python -m venv` creates before pyvenv.cfg exists (a folder holding only these is a
#: venv whose creation was interrupted, safe to clear)
VENV_SKELETON = ("bin", "include", "lib", "lib64", "Scripts", "Lib", "Include")


@probe("venv_state")
def venv_state(path: str) -> dict:
    """Describe ``path`` as a (possible) virtual environment.

    Returns ``{"path", "exists", "is_dir", "entries", "pyvenv_cfg", "python_exists",
    "skeleton_only"}``: ``pyvenv_cfg`` is the text of ``path/pyvenv.cfg`` or None;
    ``python_exists`` says whether ``path/bin/python`` resolves to an existing file (a broken
    symlink gives False); ``skeleton_only`` is True when every entry is one of the folders venv
    creates first (an interrupted creation).
    """
    p = os.path.abspath(os.path.expanduser(path))
    out = {"path": p, "exists": os.path.lexists(p), "is_dir": os.path.isdir(p), "entries": [],
           "pyvenv_cfg": None, "python_exists": False, "skeleton_only": False}
    if not out["is_dir"]:
        return out
    try:
        entries = sorted(os.listdir(p))
    except OSError:
        entries = []
    out["entries"] = entries[:50]
    out["skeleton_only"] = all(e in VENV_SKELETON for e in entries)
    cfg = os.path.join(p, "pyvenv.cfg")
    try:
        with open(cfg, encoding="utf-8", errors="replace") as fh:
            out["pyvenv_cfg"] = fh.read(65536)
    except OSError:
        pass
    out["python_exists"] = os.path.isfile(os.path.join(p, "bin", "python"))
    return out


# ---------------------------------------------------------------- a venv read from its files
#
# What a converged check needs to know of a venv, read by the agent from the venv's files so that
# no interpreter starts (a python with pip or sglang imported costs 0.1-0.3 s of CPU on a busy
# GPU server). What is read, and where the real programs put it:
#   - pyvenv.cfg `version = X.Y.Z` (CPython Lib/venv/__init__.py:190 in 3.11.7, :155 in 3.8.18;
#     virtualenv writes `version_info = X.Y.Z.final.0`);
#   - site-packages is `lib/pythonX.Y/site-packages` (the `venv` install scheme, CPython
#     Lib/sysconfig.py:79 in 3.11.7; `posix_prefix` :30);
#   - a distribution is a `*.dist-info` (or `*.egg-info`) folder of site-packages whose METADATA
#     (or PKG-INFO) headers hold Name and Version, as importlib.metadata reads them (CPython
#     Lib/importlib/metadata/__init__.py:610-611 METADATA then PKG-INFO, :835 the suffixes).
# Anything the files do not settle (no pyvenv.cfg, an unreadable version, two dist-infos of one
# name, a name absent from a venv that also sees the system site-packages) is answered as unknown,
# and the stage asks the interpreter as before.


def _cfg(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, _, value = line.partition("=")
            out[key.strip().lower()] = value.strip()
    return out


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _headers(folder: str) -> dict:
    """Name and Version from a dist-info's METADATA (an egg-info's PKG-INFO): headers only."""
    for leaf in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(folder, leaf), encoding="utf-8", errors="replace") as fh:
                out = {}
                for line in fh:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    key, sep, value = line.partition(":")
                    if sep and key in ("Name", "Version"):
                        out[key] = value.strip()
                return out
        except OSError:
            continue
    return {}


def _dists(site: str, wanted: set) -> dict:
    """{normalized name: [version, ...]} of the wanted names installed in `site`."""
    found = {}  # type: dict
    try:
        entries = os.listdir(site)
    except OSError:
        return found
    for entry in entries:
        low = entry.lower()
        if not low.endswith((".dist-info", ".egg-info")):
            continue
        stem = entry.rsplit(".", 1)[0]
        if _norm(stem.partition("-")[0]) not in wanted:
            continue
        head = _headers(os.path.join(site, entry))
        if "Name" in head and _norm(head["Name"]) in wanted:
            found.setdefault(_norm(head["Name"]), []).append(head.get("Version"))
    return found


def _marker_env(version: str, cfg: dict) -> dict:
    """PEP 508 marker variables of a CPython `version` on this host (the agent's OS)."""
    u = os.uname()
    impl = cfg.get("implementation", "CPython")
    return {
        "implementation_name": impl.lower(), "implementation_version": version,
        "os_name": os.name, "platform_machine": u.machine, "platform_release": u.release,
        "platform_system": u.sysname, "platform_version": u.version,
        "python_full_version": version, "platform_python_implementation": impl,
        "python_version": ".".join(version.split(".")[:2]), "sys_platform": sys.platform,
    }


@probe("venv_inventory")
def venv_inventory(path: str, names: list | None = None) -> dict:
    """The venv at ``path`` as its files tell: python, pip and the versions of ``names``.

    Returns venv_state's keys plus ``version`` (pyvenv.cfg; None when absent), ``python_ok``
    (bin/python resolves to an executable file), ``pip`` (pip's version when its dist-info and its
    package are both there), ``versions`` ({name: version or None}, or None when the files do not
    settle it) and ``env`` (the PEP 508 marker variables of that python). No interpreter runs.
    """
    import re

    names = list(names or [])
    out = venv_state(path)
    out.update(version=None, python_ok=False, pip=None, versions=None, env=None)
    cfg = _cfg(out["pyvenv_cfg"] or "")
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", cfg.get("version") or cfg.get("version_info") or "")
    if m is None:
        return out
    version = out["version"] = m.group(0)
    vpy = os.path.join(out["path"], "bin", "python")
    out["python_ok"] = os.path.isfile(vpy) and os.access(vpy, os.X_OK)
    lib = "python{}.{}".format(*m.group(1, 2))
    site = os.path.join(out["path"], "lib", lib, "site-packages")
    wanted = {_norm(n) for n in names} | {"pip"}
    found = _dists(site, wanted)
    pip = found.get("pip") or []
    pkg = os.path.join(site, "pip")
    if (len(pip) == 1 and os.path.isfile(os.path.join(pkg, "__init__.py"))
            and os.path.isfile(os.path.join(pkg, "__main__.py"))):
        out["pip"] = pip[0]
    system = cfg.get("include-system-site-packages", "false").lower() == "true"
    versions = {}
    for name in names:
        have = found.get(_norm(name)) or []
        if len(have) > 1 or (not have and system):
            return out  # two of one name, or maybe in the system site-packages: ask python
        versions[name] = have[0] if have else None
    out["versions"] = versions
    out["env"] = _marker_env(version, cfg)
    return out
