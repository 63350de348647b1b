"""A mirror, for the simulated package index, of real packages installed beside the simulator.

A real host installs `huggingface_hub` (and its dependencies) from PyPI. The simulated index
must not send tests to the internet, so it also serves wheels repacked from the distributions
installed in the simulator's own environment: for each requested project and its (marker-
evaluated, extra-free) requirements, the installed files listed in RECORD are packed into a wheel
of the same name and version with the same Requires-Dist. The wheels are only meant for hosts on
this machine (compiled extensions are copied as they are). Builds are deterministic and cached.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from orchestrator_sim.wheels import build_wheel, normalize_name

log = logging.getLogger(__name__)

#: projects the simulated hosts need from "PyPI" besides the stand-ins
DEFAULT_PROJECTS = ("huggingface_hub",)


def _files(dist: md.Distribution) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for f in dist.files or []:
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        if ".dist-info/" in rel or rel.endswith(".pth"):
            continue
        path = Path(str(dist.locate_file(f)))
        if path.is_file():
            out[rel] = path.read_bytes()
    return out


def _needs(dist: md.Distribution) -> list[str]:
    names = []
    for text in dist.requires or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        names.append(req.name)
    return names


def mirror_wheels(projects: Iterable[str], out_dir: Path | str) -> list[Path]:
    """Build wheels for `projects` and everything they require, from what is installed here."""
    todo = list(projects)
    seen: set[str] = set()
    built: list[Path] = []
    while todo:
        name = todo.pop()
        key = normalize_name(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            log.warning("mirror: %s is not installed beside the simulator; not served", name)
            continue
        meta_name = dist.metadata["Name"]
        built.append(build_wheel(
            out_dir, meta_name, dist.version, _files(dist), requires=dist.requires or [],
            summary=f"{meta_name} repacked by the orchestrator simulator from its environment",
        ))
        todo += _needs(dist)
    return built
