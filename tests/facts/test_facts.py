"""Every recorded host answer under tests/facts/<probe>/*.json parses into its typed fact.

A case file: {"args": {...probe arguments...}, "answer": <what the agent answered>,
"fact": <the fact's fields as plain data>} (pyinfra: tests/facts/, tests/test_facts.py).
No host is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.facts import registry, to_data

HERE = Path(__file__).resolve().parent
CASES = sorted(HERE.glob("*/*.json"))


def test_every_fact_class_has_recorded_answers() -> None:
    recorded = {p.parent.name for p in CASES}
    assert set(registry()) <= recorded, set(registry()) - recorded


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recorded_answer_parses(path: Path) -> None:
    case = json.loads(path.read_text())
    cls = registry()[path.parent.name]
    assert to_data(cls.from_answer(case["answer"])) == case["fact"]
