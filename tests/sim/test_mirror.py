"""The simulated index also serves real packages repacked from the simulator's environment.
(Installing them with real pip is exercised by every end-to-end deploy: tests/e2e.)"""

from __future__ import annotations

import urllib.request
import zipfile
from pathlib import Path

from orchestrator_sim.mirror import mirror_wheels
from orchestrator_sim.pkgindex import PackageIndex


def test_huggingface_hub_and_its_requirements_are_mirrored_and_served(tmp_path: Path) -> None:
    wheels = mirror_wheels(["huggingface_hub"], tmp_path / "wheels")
    by_name = {w.name.split("-")[0]: w for w in wheels}
    assert {"huggingface_hub", "filelock", "packaging"} <= set(by_name)
    with zipfile.ZipFile(by_name["huggingface_hub"]) as zf:
        names = zf.namelist()
        meta = zf.read("huggingface_hub-2.4.0.dist-info/METADATA").decode()
    assert "huggingface_hub/__init__.py" in names
    assert not any("__pycache__" in n for n in names)
    assert "Requires-Dist: filelock" in meta
    again = mirror_wheels(["huggingface_hub"], tmp_path / "wheels")
    assert [w.stat().st_mtime_ns for w in again] == [w.stat().st_mtime_ns for w in wheels]

    index = PackageIndex([tmp_path / "wheels"])
    index.start("127.0.0.1", 0)
    try:
        page = urllib.request.urlopen(index.url + "huggingface-hub/", timeout=10).read().decode()
    finally:
        index.stop()
    assert "huggingface_hub-2.4.0-py3-none-any.whl#sha256=" in page


def test_a_project_not_installed_here_is_skipped(tmp_path: Path) -> None:
    assert mirror_wheels(["surely-not-installed-project-xyz"], tmp_path / "w") == []
