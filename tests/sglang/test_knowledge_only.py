"""orchestrator/sglang/ is knowledge of SGLang only (flags per release, rules with citations, the
launch command, API shapes): none of its modules imports the host, the stages, the facts or the
host programs, not even inside a function or an `if TYPE_CHECKING:` block."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator.sglang

ROOT = Path(orchestrator.sglang.__file__).resolve().parent
FORBIDDEN = ("orchestrator.host", "orchestrator.stages", "orchestrator.facts",
             "orchestrator.remote")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "orchestrator":  # from orchestrator import host
                found += [(node.lineno, f"orchestrator.{a.name}") for a in node.names]
    return found


def test_sglang_imports_nothing_of_host_stages_facts_or_remote() -> None:
    modules = sorted(ROOT.rglob("*.py"))
    assert len(modules) > 10
    bad = [f"{path.relative_to(ROOT.parent)}:{line} imports {name}"
           for path in modules for line, name in _imports(path)
           if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == []


def test_the_check_sees_a_function_level_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from orchestrator.stages.base import StageContext\n"
                     "def f():\n    from orchestrator import host\n")
    assert [name for _, name in _imports(probe)] == [
        "typing", "orchestrator.stages.base", "orchestrator", "orchestrator.host"]
