"""Host-side facts about Python virtual environments (stdlib only, Python 3.8+).

Probe ``venv_state(path)``: what is at ``path`` (nothing, a file, an empty folder, a venv, a
half-created venv, something else), read with plain os calls so it works the same on any host.
Used by the ``python_venv`` stage kind to decide between create, repair and recreate.
"""

from __future__ import annotations

import os

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
