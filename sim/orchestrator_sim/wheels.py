"""Build pure-Python wheels for the simulated host, with zipfile only (no setuptools, no network).

The simulated host installs its SGLang and compressed-tensors stand-ins with real pip from a
local package index (see pkgindex.py). This module writes those wheels:

- `build_wheel` writes one valid `py3-none-any` wheel (METADATA, WHEEL, entry_points.txt, RECORD
  with sha256 hashes). The output is deterministic: fixed timestamps, sorted members, fixed
  permissions, so the same inputs always give the same bytes (and the same sha256).
- `build_standin_wheels` builds every stand-in release the simulator offers.

Versions carry NO local label (`0.5.23`, not `0.5.23+sim`): `importlib.metadata.version("sglang")`
on the simulated host then prints exactly what it would print on a real one, and pins such as
`sglang==0.5.23` match either way. The stand-ins are recognisable by their Summary line.

Run `python -m orchestrator_sim.wheels OUT_DIR` to build them by hand.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import orchestrator.sglang.releases

STANDINS_DIR = Path(__file__).resolve().parent / "standins"

# The releases the simulated index offers, and what each declares (FACTS.md "compressed-tensors").
SGLANG_RELEASES: dict[str, list[str]] = {
    # Requires-Dist of the real wheels' METADATA: `compressed-tensors` unpinned in 0.5.9 and
    # 0.5.15, `compressed-tensors==0.18.0` from 0.5.19 (checked for each supported release)
    **{v: ["compressed-tensors"] for v in ("0.5.9", "0.5.10", "0.5.12", "0.5.15")},
    **{v: ["compressed-tensors==0.18.0"] for v in ("0.5.19", "0.5.20", "0.5.21", "0.5.22",
                                                    "0.5.23")},
}
#: the generated flag data of each release (scripts/sync_sglang.py), shipped inside the
#: stand-in wheel as sglang/_release_flags.json: the stand-in builds its argparse from it
RELEASE_FLAGS_DIR = Path(orchestrator.sglang.releases.__file__).resolve().parent
COMPRESSED_TENSORS_RELEASES: tuple[str, ...] = ("0.8.1", "0.10.0", "0.18.0")

_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_NAME_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+_-]*)$", re.IGNORECASE)


def normalize_name(name: str) -> str:
    """PEP 503 normalized project name (`Compressed_Tensors` -> `compressed-tensors`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_stem(name: str, version: str) -> str:
    """`{distribution}-{version}` as a wheel file name spells it (PEP 427 escaping)."""
    dist = re.sub(r"[-_.]+", "_", name).lower()
    return f"{dist}-{version.replace('-', '_')}"


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _metadata(
    name: str, version: str, requires: Iterable[str], summary: str, requires_python: str
) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {summary}",
        f"Requires-Python: {requires_python}",
    ]
    lines += [f"Requires-Dist: {req}" for req in requires]
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def _entry_points_txt(entry_points: Mapping[str, Mapping[str, str]]) -> bytes:
    out = []
    for group in sorted(entry_points):
        out.append(f"[{group}]")
        out += [f"{key} = {value}" for key, value in sorted(entry_points[group].items())]
        out.append("")
    return "\n".join(out).encode("utf-8")


def wheel_bytes(
    name: str,
    version: str,
    files: Mapping[str, bytes],
    requires: Iterable[str] = (),
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    summary: str = "Simulated package (orchestrator simulator)",
    requires_python: str = ">=3.8",
) -> tuple[str, bytes]:
    """Return (file name, bytes) of the wheel; see build_wheel."""
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid distribution name {name!r}")
    if not _VERSION_RE.match(version):
        raise ValueError(f"invalid version {version!r}")
    stem = _wheel_stem(name, version)
    dist_info = f"{stem}.dist-info"
    members: dict[str, bytes] = {}
    for arcname, data in files.items():
        clean = arcname.replace("\\", "/").lstrip("/")
        if not clean or ".." in clean.split("/") or clean.startswith(dist_info + "/"):
            raise ValueError(f"invalid file name in wheel: {arcname!r}")
        members[clean] = bytes(data)
    meta: dict[str, bytes] = {
        f"{dist_info}/METADATA": _metadata(name, version, requires, summary, requires_python),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: orchestrator_sim.wheels\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n\n"
        ).encode("ascii"),
        f"{dist_info}/top_level.txt": "".join(
            sorted({p.split("/")[0].removesuffix(".py") + "\n" for p in members})
        ).encode("utf-8"),
    }
    if entry_points:
        meta[f"{dist_info}/entry_points.txt"] = _entry_points_txt(entry_points)
    record_name = f"{dist_info}/RECORD"
    ordered = sorted(members.items()) + sorted(meta.items())

    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arcname, data in ordered:
        writer.writerow([arcname, _record_hash(data), str(len(data))])
    writer.writerow([record_name, "", ""])

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in [*ordered, (record_name, record.getvalue().encode("utf-8"))]:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_DATE)
            info.external_attr = (0o100644 & 0xFFFF) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the permissions above are honoured
            zf.writestr(info, data)
    return f"{stem}-py3-none-any.whl", buf.getvalue()


def build_wheel(
    out_dir: Path | str,
    name: str,
    version: str,
    files: Mapping[str, bytes],
    requires: Iterable[str] = (),
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    summary: str = "Simulated package (orchestrator simulator)",
) -> Path:
    """Write a py3-none-any wheel of `files` (archive name -> bytes) into out_dir; return its path.

    `requires` become Requires-Dist lines; `entry_points` maps a group (`console_scripts`) to
    {name: "module:function"}. When a wheel with identical bytes already exists it is left
    untouched (same mtime), so repeated builds are cheap and never disturb a running index.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    filename, data = wheel_bytes(name, version, files, requires, entry_points, summary)
    target = out / filename
    try:
        if target.read_bytes() == data:
            return target
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def package_sources(package: str, version: str) -> dict[str, bytes]:
    """The files of stand-in `package` (a folder under standins/), with version.py filled in."""
    root = STANDINS_DIR / package
    if not root.is_dir():
        raise FileNotFoundError(f"no stand-in package {package!r} under {STANDINS_DIR}")
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        files[path.relative_to(STANDINS_DIR).as_posix()] = path.read_bytes()
    files[f"{package}/version.py"] = (
        f'"""Version of this {package} stand-in (written by the wheel builder)."""\n\n'
        f'__version__ = "{version}"\n'
    ).encode()
    if package == "sglang":
        files["sglang/_release_flags.json"] = (RELEASE_FLAGS_DIR / f"{version}.json").read_bytes()
    return files


def build_standin_wheels(out_dir: Path | str) -> list[Path]:
    """Build every stand-in release (sglang: SGLANG_RELEASES; compressed-tensors: 3 releases).

    Returns the wheel paths. Unchanged wheels are not rewritten.
    """
    paths: list[Path] = []
    for version in COMPRESSED_TENSORS_RELEASES:
        paths.append(
            build_wheel(
                out_dir,
                "compressed-tensors",
                version,
                package_sources("compressed_tensors", version),
                summary="compressed-tensors stand-in for the orchestrator simulator",
            )
        )
    for version, requires in SGLANG_RELEASES.items():
        paths.append(
            build_wheel(
                out_dir,
                "sglang",
                version,
                package_sources("sglang", version),
                requires=requires,
                entry_points={"console_scripts": {"sglang": "sglang.cli.main:main"}},
                summary="SGLang stand-in for the orchestrator simulator (no GPU code)",
            )
        )
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command line: build the stand-in wheels into the given folder and print their paths."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestrator_sim.wheels OUT_DIR", file=sys.stderr)
        return 2
    for path in build_standin_wheels(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
