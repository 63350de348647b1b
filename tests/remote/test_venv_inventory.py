"""The agent's file-only view of a venv (`venv_inventory`) says what the venv's own python says.

The interpreter's answers (importlib.metadata, the PEP 508 marker variables of
orchestrator/remote/distributions.py) are the judge: run in this very venv, they must equal what
the probe reads from pyvenv.cfg and the dist-info folders without starting anything.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.remote import distributions
from orchestrator.remote.pyenv import venv_inventory

NAMES = ["pytest", "PyYAML", "pydantic_core", "structlog", "pip", "surely-not-installed"]


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests do not run in a venv")
def test_versions_and_markers_equal_the_interpreters_own() -> None:
    inv = venv_inventory(sys.prefix, NAMES)
    assert inv["python_ok"] and inv["version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert inv["versions"] == distributions.versions(NAMES)
    assert inv["pip"] == md.version("pip")
    env = distributions.marker_env()
    assert {k: inv["env"][k] for k in env} == env


def test_a_venv_without_pip_and_the_cases_the_files_do_not_settle(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    inv = venv_inventory(str(venv), ["pytest"])
    assert inv["python_ok"] and inv["pip"] is None and inv["versions"] == {"pytest": None}
    site = next((venv / "lib").glob("python3*/site-packages"))
    # a leftover second dist-info of one name: which one imports is the interpreter's call
    for version in ("1.0", "2.0"):
        info = site / f"demo_pkg-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: demo-pkg\n"
                                       f"Version: {version}\n\nbody\n")
    assert venv_inventory(str(venv), ["demo-pkg"])["versions"] is None
    shutil.rmtree(site / "demo_pkg-1.0.dist-info")
    assert venv_inventory(str(venv), ["Demo_Pkg"])["versions"] == {"Demo_Pkg": "2.0"}
    # with the system site-packages visible, a name absent from the venv may be there
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("include-system-site-packages = false",
                                           "include-system-site-packages = true"))
    assert venv_inventory(str(venv), ["pytest"])["versions"] is None
    assert venv_inventory(str(venv), ["demo-pkg"])["versions"] == {"demo-pkg": "2.0"}
    # its interpreter gone (base python removed): not python_ok, so the stage asks it
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "gone")
    assert not venv_inventory(str(venv), [])["python_ok"]
