"""ARCHITECTURE.md's layer table is enforced: its rows are the import-linter contracts in
.importlinter (scripts/contracts.py), every part of the product has a row, `lint-imports` keeps
them all, and an import that runs upward is caught."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import contracts

REPO = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or \
    shutil.which("lint-imports")

needs_linter = pytest.mark.skipif(LINT is None, reason="import-linter is not installed")


def _parts() -> set[str]:
    pkg = REPO / "orchestrator"
    return {p.stem if p.is_file() else p.name for p in pkg.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py")
            or (p.is_dir() and (p / "__init__.py").exists())}


def _lint(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert LINT is not None
    return subprocess.run([LINT, "--no-cache", "--no-logo"], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def test_every_part_of_the_product_has_a_row() -> None:
    rows = contracts.layers((REPO / "ARCHITECTURE.md").read_text())
    assert set(rows) == _parts()


def test_the_contracts_are_the_table() -> None:
    assert (REPO / ".importlinter").read_text() == contracts.render(
        contracts.layers((REPO / "ARCHITECTURE.md").read_text()))


def _section(text: str, key: str) -> dict[str, list[str]]:
    body = text.split(f"[importlinter:contract:{key}]\n")[1].split("\n[")[0]
    out: dict[str, list[str]] = {}
    last = ""
    for line in body.splitlines():
        if line.startswith("    "):
            out[last].append(line.strip())
        elif "=" in line:
            last, value = (x.strip() for x in line.split("=", 1))
            out[last] = [value] if value else []
    return out


def test_a_row_forbids_every_part_it_does_not_name() -> None:
    text = contracts.render({"cli": None, "__main__": ["cli"], "a": ["b"], "b": []})
    a, b, cli = (_section(text, k) for k in ("a", "b", "cli"))
    assert a["source_modules"] == ["orchestrator.a"]
    assert a["forbidden_modules"] == ["orchestrator.cli", "orchestrator.__main__"]
    assert b["forbidden_modules"] == ["orchestrator.cli", "orchestrator.__main__",
                                      "orchestrator.a"]
    assert cli["source_modules"] == ["orchestrator.a", "orchestrator.b"]
    assert cli["forbidden_modules"] == ["orchestrator.cli"]
    assert a["allow_indirect_imports"] == ["True"]


@needs_linter
def test_lint_imports_keeps_every_contract() -> None:
    r = _lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@needs_linter
@pytest.mark.parametrize(("module", "upward", "contract"), [
    ("sglang/flags.py", "import orchestrator.host", "sglang imports only: errors"),
    ("facts/base.py", "from orchestrator import stages", "facts imports only: nothing of ours"),
    ("config/model.py", "import orchestrator.stages.base", "config imports only:"),
    ("remote/probes.py", "import orchestrator.errors", "remote imports only:"),
])
def test_an_upward_import_breaks_its_contract(tmp_path: Path, module: str, upward: str,
                                              contract: str) -> None:
    shutil.copytree(REPO / "orchestrator", tmp_path / "orchestrator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    target = tmp_path / "orchestrator" / module
    target.write_text(target.read_text() + f"\n\ndef _upward() -> None:\n    {upward}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = _lint(tmp_path, env)
    assert r.returncode == 1, r.stdout + r.stderr
    broken = [line for line in r.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and broken[0].startswith(contract), r.stdout
    contracts = (REPO / ".importlinter").read_text().count("[importlinter:contract:")
    assert f"Contracts: {contracts - 1} kept, 1 broken." in r.stdout
