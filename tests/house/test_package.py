"""The wheel people install: its name, what it ships (the simulator and the playbooks and
configs `orchestrator init` copies out), its extras and bounded dependencies; `init` and the
completion scripts. Built here without network (no build isolation: the venv's setuptools)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from tests.runner.helpers import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    src = tmp_path_factory.mktemp("src")  # setuptools writes build/ and egg-info beside it
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("orchestrator", "sim", "playbooks", "configs"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(src)],
                   check=True, capture_output=True, timeout=300, cwd=src)
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_is_named_free_and_ships_the_sim_and_the_project_files(wheel) -> None:
    names = set(wheel.namelist())
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = HeaderParser().parsestr(wheel.read(meta_name).decode())
    assert meta["Name"] == "sglang-orchestrator"  # `orchestrator` is taken on PyPI
    for path in ("orchestrator/project/playbooks/kimi-k2.6-eagle3.yaml",
                 "orchestrator/project/configs/models/kimi-k2.6.yaml",
                 "orchestrator/project/playbooks/examples/hello.yaml",
                 "orchestrator_sim/standins/sglang/srt/engine.py",
                 "orchestrator/sglang/releases/0.5.23.json"):
        assert path in names, path
    assert set(meta.get_all("Provides-Extra")) >= {"report", "sim", "dev"}
    base = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert base and all("<" in r for r in base), base  # every dependency bounded above
    assert not any(r.startswith("matplotlib") for r in base)  # only with [report]
    entry = wheel.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
    assert "orchestrator = orchestrator.cli.main:entry" in entry
    assert "sim = orchestrator_sim.cli:add_subcommands" in entry


def test_init_copies_the_playbooks_and_configs_and_keeps_what_is_there(tmp_path: Path) -> None:
    r = cli("init", str(tmp_path / "demo"), runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    pb = tmp_path / "demo" / "playbooks" / "kimi-k2.6-eagle3.yaml"
    assert pb.read_text() == (REPO / "playbooks" / "kimi-k2.6-eagle3.yaml").read_text()
    assert (tmp_path / "demo" / "configs" / "models" / "kimi-k2.6.yaml").is_file()
    pb.write_text("# mine\n")
    again = cli("init", str(tmp_path / "demo"), runs=tmp_path / "runs")
    assert again.code == 0 and pb.read_text() == "# mine\n" and "kept" in again.stderr
    forced = cli("init", str(tmp_path / "demo"), "--force", runs=tmp_path / "runs")
    assert forced.code == 0 and pb.read_text() != "# mine\n"
    # the copy validates as it is (the playbook finds its profile beside it)
    v = cli("validate", str(pb), runs=tmp_path / "runs")
    assert v.code == 0, v.stdout + v.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_know_the_commands_and_options(shell: str, tmp_path: Path) -> None:
    r = cli("completion", shell, runs=tmp_path / "runs")
    assert r.code == 0, r.stderr
    for word in ("deploy", "plan", "validate", "tune", "--vars-file", "--max-unavailable"):
        assert word in r.stdout, word
