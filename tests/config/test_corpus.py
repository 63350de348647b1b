import os

import pytest

from orchestrator.config import load_all, load_playbook
from orchestrator.errors import ConfigError
from tests.config.corpus import UNSET_ENV, corpus_cases

CASES = corpus_cases()


def test_corpus_is_big_enough():
    assert len(CASES) >= 18
    assert sum(c.is_inventory for c in CASES) >= 3


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_corpus_case(case, monkeypatch):
    for name in UNSET_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as exc:
        if case.inventory is None:
            load_playbook(case.playbook)
        else:
            load_all(case.playbook, case.inventory)
    at_line = [
        p for p in exc.value.problems
        if p.location is not None
        and os.path.samefile(p.location.file, case.path)
        and p.location.line == case.line
    ]
    assert at_line, f"no problem at line {case.line}:\n{exc.value.render()}"
    assert any(all(f in p.render() for f in case.fragments) for p in at_line), (
        f"expected {case.fragments} at line {case.line}:\n{exc.value.render()}"
    )
    assert "Traceback" not in exc.value.render()
