"""No stage kind keeps state on itself between check, apply and verify: what check found
travels in `Needed.plan`, so two hosts (or two attempts) on one stage object share nothing."""

from __future__ import annotations

import ast
from pathlib import Path

STAGES = Path(__file__).resolve().parents[2] / "orchestrator" / "stages"


def _self_assignments(tree: ast.Module) -> list[int]:
    """Lines that assign an attribute of `self` (outside Stage.__init__'s `self.params`)."""
    lines = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        lines += [node.lineno for t in targets
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id == "self" and t.attr != "params"]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "setattr" and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "self"):
            lines.append(node.lineno)
    return lines


def test_no_stage_kind_assigns_to_self() -> None:
    found = [f"{p.relative_to(STAGES)}:{line}" for p in sorted(STAGES.rglob("*.py"))
             for line in _self_assignments(ast.parse(p.read_text()))]
    assert found == []


def test_the_check_sees_an_assignment_to_self() -> None:
    tree = ast.parse("class S:\n    def check(self):\n        self._commit = 1\n")
    assert _self_assignments(tree) == [3]
