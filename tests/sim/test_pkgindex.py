"""The simulated package index and its wheels, driven by real pip in a real venv (loopback)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from orchestrator_sim.pkgindex import PackageIndex
from orchestrator_sim.wheels import build_standin_wheels, build_wheel, wheel_bytes
from tests.sim.conftest_index import Venv, clean_env


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _get(url: str, follow: bool = True) -> tuple[int, dict[str, str], bytes]:
    opener = urllib.request.build_opener(*(() if follow else (_NoRedirect(),)))
    try:
        with opener.open(url, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _links(page: bytes) -> list[dict[str, str]]:
    out = []
    for tag in re.findall(rb"<a ([^>]*)>", page):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag.decode()))
        out.append(attrs)
    return out


# ----------------------------------------------------------------------------- wheels


def test_wheel_record_hashes_match_and_builds_are_deterministic(tmp_path: Path) -> None:
    files = {"demo/__init__.py": b"X = 1\n", "demo/sub/mod.py": b"Y = 2\n"}
    path = build_wheel(tmp_path, "Demo_Pkg", "1.2.3", files, requires=["other>=1"],
                       entry_points={"console_scripts": {"demo": "demo:main"}})
    assert path.name == "demo_pkg-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(path) as zf:
        record = zf.read("demo_pkg-1.2.3.dist-info/RECORD").decode()
        rows = list(csv.reader(io.StringIO(record)))
        assert sorted(r[0] for r in rows) == sorted(zf.namelist())
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode()
            assert int(size) == len(data)
        meta = zf.read("demo_pkg-1.2.3.dist-info/METADATA").decode()
        assert "Name: Demo_Pkg\n" in meta and "Requires-Dist: other>=1\n" in meta
        assert "demo = demo:main" in zf.read("demo_pkg-1.2.3.dist-info/entry_points.txt").decode()

    # same inputs -> same bytes, and the file is left untouched (mtime kept)
    first = path.read_bytes()
    old = time.time() - 3600
    os.utime(path, (old, old))
    again = build_wheel(tmp_path, "Demo_Pkg", "1.2.3", files, requires=["other>=1"],
                        entry_points={"console_scripts": {"demo": "demo:main"}})
    assert again.read_bytes() == first
    assert abs(again.stat().st_mtime - old) < 1
    # changed sources -> rewritten
    build_wheel(tmp_path, "Demo_Pkg", "1.2.3", {**files, "demo/__init__.py": b"X = 2\n"})
    assert path.read_bytes() != first
    with pytest.raises(ValueError):
        wheel_bytes("demo", "1.0", {"../evil.py": b""})


def test_standin_wheels_declare_the_facts_dependencies(sim_wheels: Path) -> None:
    names = sorted(p.name for p in sim_wheels.glob("*.whl"))
    assert names == [
        "compressed_tensors-0.10.0-py3-none-any.whl",
        "compressed_tensors-0.18.0-py3-none-any.whl",
        "compressed_tensors-0.8.1-py3-none-any.whl",
        *sorted(f"sglang-{v}-py3-none-any.whl" for v in (
            "0.5.9", "0.5.10", "0.5.12", "0.5.15", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
            "0.5.23")),
    ]

    def requires(wheel: str) -> list[str]:
        with zipfile.ZipFile(sim_wheels / wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith("METADATA"))
            text = zf.read(meta).decode()
            return re.findall(r"^Requires-Dist: (.*)$", text, re.M)

    assert requires("sglang-0.5.9-py3-none-any.whl") == ["compressed-tensors"]
    assert requires("sglang-0.5.15-py3-none-any.whl") == ["compressed-tensors"]
    assert requires("sglang-0.5.19-py3-none-any.whl") == ["compressed-tensors==0.18.0"]
    assert requires("sglang-0.5.23-py3-none-any.whl") == ["compressed-tensors==0.18.0"]
    with zipfile.ZipFile(sim_wheels / "sglang-0.5.23-py3-none-any.whl") as zf:
        assert zf.read("sglang/version.py").decode().endswith('__version__ = "0.5.23"\n')
        # the flags of that very release, generated from its real wheel
        assert json.loads(zf.read("sglang/_release_flags.json"))["version"] == "0.5.23"
    # a second build changes nothing
    before = {p.name: p.stat().st_mtime_ns for p in sim_wheels.glob("*.whl")}
    build_standin_wheels(sim_wheels)
    assert {p.name: p.stat().st_mtime_ns for p in sim_wheels.glob("*.whl")} == before


# ----------------------------------------------------------------------------- index


def test_simple_api_lists_projects_with_hashes_and_python_requirement(
    sim_index: PackageIndex, sim_wheels: Path
) -> None:
    status, headers, body = _get(sim_index.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    hrefs = [a["href"] for a in _links(body)]
    assert hrefs == ["/simple/compressed-tensors/", "/simple/sglang/"]

    status, _, body = _get(sim_index.url + "compressed-tensors/")
    assert status == 200
    links = _links(body)
    assert len(links) == 3
    for link in links:
        path, _, fragment = link["href"].partition("#sha256=")
        name = path.rsplit("/", 1)[1]
        assert fragment == hashlib.sha256((sim_wheels / name).read_bytes()).hexdigest()
        assert link["data-requires-python"] == "&gt;=3.8"
        # the file and its PEP 658 metadata are served, and the hashes match
        status, _, data = _get(sim_index.url.replace("/simple/", "") + path)
        assert status == 200 and hashlib.sha256(data).hexdigest() == fragment
        status, _, meta = _get(sim_index.url.replace("/simple/", "") + path + ".metadata")
        assert status == 200
        assert link["data-dist-info-metadata"] == "sha256=" + hashlib.sha256(meta).hexdigest()

    # a non-normalized name redirects to the normalized URL; unknown projects are 404
    status, headers, _ = _get(sim_index.url + "Compressed_Tensors/", follow=False)
    assert status == 301 and headers["Location"] == "/simple/compressed-tensors/"
    assert _get(sim_index.url + "Compressed_Tensors/")[0] == 200
    assert _get(sim_index.url + "torch/")[0] == 404
    assert _get(sim_index.url.replace("/simple/", "/files/nope.whl"))[0] == 404


def test_rescans_folders_and_falls_through_to_upstream(tmp_path: Path) -> None:
    late = tmp_path / "late"  # does not exist yet when the index starts
    upstream_dir = tmp_path / "upstream"
    build_wheel(upstream_dir, "only-upstream", "1.0", {"only_upstream.py": b""})
    with PackageIndex([upstream_dir]) as upstream, PackageIndex(
        [tmp_path / "first", late], upstream=upstream.url
    ) as index:
        assert _get(index.url + "late-pkg/", follow=False)[0] == 302  # unknown -> upstream
        build_wheel(late, "late-pkg", "0.1", {"late_pkg.py": b""})
        status, _, body = _get(index.url + "late-pkg/")
        assert status == 200 and b"late_pkg-0.1-py3-none-any.whl" in body
        status, headers, _ = _get(index.url + "only-upstream/", follow=False)
        assert status == 302 and headers["Location"] == upstream.url + "only-upstream/"
        status, _, body = _get(index.url + "only-upstream/")  # followed to the upstream page
        assert status == 200 and b"only_upstream-1.0-py3-none-any.whl" in body
        url = index.url
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)  # stopped: connection refused


# ----------------------------------------------------------------------------- real pip


def test_pip_installs_sglang_with_its_pinned_compressed_tensors(
    standin_venv: Venv, sim_index: PackageIndex
) -> None:
    assert standin_venv.version("sglang") == "0.5.23"
    assert standin_venv.version("compressed-tensors") == "0.18.0"
    out = subprocess.run(
        [str(standin_venv.root / "bin" / "sglang"), "version"], env=clean_env(),
        capture_output=True, text=True, timeout=60,
    )
    assert out.stdout.strip() == "0.5.23"  # console script from entry_points.txt
    # a second install is a no-op that pip resolves from the index
    proc = standin_venv.pip("install", "sglang==0.5.23")
    assert "Requirement already satisfied: sglang==0.5.23" in proc.stdout


def test_compressed_tensors_081_lacks_nvfp4_then_upgrade_restores_it(
    standin_venv: Venv,
) -> None:
    probe = (
        "from compressed_tensors import CompressionFormat as F; "
        "print(F.nvfp4_pack_quantized.value)"
    )
    proc = standin_venv.pip("install", "compressed-tensors==0.8.1")
    # pip itself warns that sglang 0.5.23 pins 0.18.0, as it would on a real host
    assert "sglang 0.5.23 requires compressed-tensors==0.18.0" in proc.stderr
    try:
        run = subprocess.run([str(standin_venv.python), "-c", probe], env=clean_env(),
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 1
        assert run.stderr.strip().splitlines()[-1].startswith(
            "AttributeError: nvfp4_pack_quantized")
    finally:
        standin_venv.pip("install", "--upgrade", "compressed-tensors>=0.10.0")
    assert standin_venv.version("compressed-tensors") == "0.18.0"
    run = subprocess.run([str(standin_venv.python), "-c", probe], env=clean_env(),
                         capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.strip() == "nvfp4-pack-quantized"
