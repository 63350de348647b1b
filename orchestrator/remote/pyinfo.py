"""Facts about a python interpreter and its pip, printed by that interpreter.

A program (stdlib only; `info` imports only json, os and sys, so it answers even where the rest
of the stdlib is broken) run ON the host by the python_venv stage as `PYTHON -c TEXT OP`, with
the interpreter it asks about; the last stdout line is the JSON answer. OP is one of:

  - ``info``: ``{"version": "3.12.3", "prefix", "base_prefix"}`` (run by the python that would
    create the venv, whatever its version: this file keeps to syntax every Python 3 reads, so
    its hints are type comments).
  - ``info_pip``: ``{"version", "pip"}``, pip's version when pip imports (else null): the quick
    look between the repair steps.
  - ``find_wheels``: the pip wheels already on the host (ensurepip's bundled one, Debian's
    python-wheels), newest first; run by the venv's python, whose stdlib is the base one.
"""

import json
import os
import sys

WHEEL_DIRS = ("/usr/share/python-wheels", "/usr/share/python3/wheels")


def _version():
    # type: () -> str
    return "{}.{}.{}".format(*sys.version_info[:3])


def info():
    # type: () -> dict
    """The interpreter's version and prefixes."""
    return {"version": _version(), "prefix": sys.prefix,
            "base_prefix": getattr(sys, "base_prefix", sys.prefix)}


def info_pip():
    # type: () -> dict
    """The interpreter's version, and pip's when pip imports (None when it does not)."""
    try:
        import pip
        v = pip.__version__
    except Exception:
        v = None
    return {"version": _version(), "pip": v}


def _wheel_key(path):
    # type: (str) -> list
    import re

    m = re.match(r"pip-([0-9.]+)-", os.path.basename(path))
    return [int(x) for x in m.group(1).split(".") if x.isdigit()] if m else []


def find_wheels(dirs=None):
    # type: (list | None) -> list
    """Paths of pip wheels in DIRS (default: ensurepip's bundle and WHEEL_DIRS), newest first."""
    import glob
    import sysconfig

    if dirs is None:
        dirs = [os.path.join(sysconfig.get_paths()["stdlib"], "ensurepip", "_bundled")]
        dirs += list(WHEEL_DIRS)
    found = []
    for d in dirs:
        found += glob.glob(os.path.join(d, "pip-*-py3-none-any.whl"))
        found += glob.glob(os.path.join(d, "pip-*-py2.py3-none-any.whl"))
    return sorted(set(found), key=_wheel_key, reverse=True)


OPS = {"info": info, "info_pip": info_pip, "find_wheels": find_wheels}


def main(argv=None):
    # type: (list | None) -> None
    """Print the answer of the op ARGV[0] (default: sys.argv[1]) as one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(OPS[args[0]]()))


if __name__ == "__main__":
    main()
