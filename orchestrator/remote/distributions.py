"""Installed distribution versions and the PEP 508 marker environment of a python.

A program (stdlib only, Python 3.8+) run ON the host by the pip_install stage with the venv's
python, as `PYTHON -c TEXT NAMES_JSON`. The last stdout line is ``{"versions": {name: version or
null}, "env": {marker variable: value}}``: what is installed, and what environment markers
(``python_version``, ``sys_platform``, ...) evaluate against, as that python sees them.
"""

import json
import os
import platform
import re
import sys


def norm(name: str) -> str:
    """A distribution name normalized as PEP 503 does (`Foo_bar.baz` -> `foo-bar-baz`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def versions(names: list) -> dict:
    """{name: installed version or None}; names not found directly are matched normalized."""
    try:  # imported here: the agent ships this module and should not pay for it at start
        import importlib.metadata as md
    except ImportError:  # a python older than 3.8: nothing can be read
        md = None
    out = {}
    dists = None
    for name in names:
        v = None
        if md is not None:
            try:
                v = md.version(name)
            except Exception:
                if dists is None:
                    dists = {}
                    for d in md.distributions():
                        try:
                            dists.setdefault(norm(d.metadata["Name"] or ""), d.version)
                        except Exception:
                            pass
                v = dists.get(norm(name))
        out[name] = v
    return out


def _fmt(info) -> str:
    v = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        v += info.releaselevel[0] + str(info.serial)
    return v


def marker_env() -> dict:
    """The PEP 508 marker variables of this python."""
    return {
        "implementation_name": sys.implementation.name,
        "implementation_version": _fmt(sys.implementation.version),
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def main(argv: "list | None" = None) -> None:
    """Print the versions of the names in ARGV[0] (a JSON list) and the marker environment."""
    names = json.loads((sys.argv[1:] if argv is None else argv)[0])
    print(json.dumps({"versions": versions(names), "env": marker_env()}))


if __name__ == "__main__":
    main()
