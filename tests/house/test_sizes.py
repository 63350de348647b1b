"""The house stays small where it matters: no class over 300 lines, no stage class over 250, no
function over 60, and no pickle anywhere in the product (what is read back is data, never code).

Product code is orchestrator/ (the simulator is a package of its own). Each limit is checked on
every module's syntax tree; a failure names the file, the line and the size.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PRODUCT = Path(__file__).resolve().parents[2] / "orchestrator"
MAX_CLASS, MAX_STAGE_CLASS, MAX_FUNCTION = 300, 250, 60


def _modules() -> list[Path]:
    return sorted(p for p in PRODUCT.rglob("*.py") if "sim" not in p.relative_to(PRODUCT).parts)


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in _modules()]


def _size(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def _is_stage(cls: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Name) and b.id == "Stage" or
               isinstance(b, ast.Attribute) and b.attr == "Stage" for b in cls.bases)


def oversized(trees: list[tuple[Path, ast.Module]]) -> list[str]:
    """Every class and function over its limit, as 'path:line name (N lines > LIMIT)'."""
    found = []
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                limit = MAX_STAGE_CLASS if _is_stage(node) else MAX_CLASS
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_FUNCTION
            else:
                continue
            if _size(node) > limit:
                found.append(f"{path.relative_to(PRODUCT.parent)}:{node.lineno} {node.name} "
                             f"({_size(node)} lines > {limit})")
    return found


def pickles(trees: list[tuple[Path, ast.Module]]) -> list[str]:
    """Every import of pickle (or a module that unpickles: shelve, dill) in product code."""
    banned = {"pickle", "_pickle", "cPickle", "shelve", "dill", "cloudpickle"}
    found = []
    for path, tree in trees:
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in banned for n in names):
                found.append(f"{path.relative_to(PRODUCT.parent)}:{node.lineno}")
    return found


def test_product_has_modules() -> None:
    assert len(_modules()) > 50  # the scan looks at the real tree


def test_no_class_or_function_over_its_limit() -> None:
    assert oversized(_trees()) == []


def test_no_pickle_in_product_code() -> None:
    assert pickles(_trees()) == []


@pytest.mark.parametrize(("source", "expected"), [
    ("class A:\n" + "    x = 1\n" * 300, ["A (301 lines > 300)"]),
    ("class A:\n" + "    x = 1\n" * 299, []),
    ("class K(Stage):\n" + "    x = 1\n" * 250, ["K (251 lines > 250)"]),
    ("def f():\n" + "    x = 1\n" * 60, ["f (61 lines > 60)"]),
    ("def f():\n" + "    x = 1\n" * 59, []),
])
def test_limits_catch_what_they_should(source: str, expected: list[str]) -> None:
    found = oversized([(PRODUCT / "x.py", ast.parse(source))])
    assert [f.split(" ", 1)[1] for f in found] == expected


@pytest.mark.parametrize(("source", "caught"), [
    ("import pickle", True), ("from pickle import loads", True), ("import _pickle as p", True),
    ("def f():\n    import shelve", True), ("import json", False), ("import marshal", False),
])
def test_pickle_scan_catches_every_form(source: str, caught: bool) -> None:
    assert bool(pickles([(PRODUCT / "x.py", ast.parse(source))])) is caught
