"""Plan building: selection flags, host targeting and cycles."""

from __future__ import annotations

import pytest

from orchestrator.config.model import Inventory, Playbook
from orchestrator.errors import PlanError
from orchestrator.plan import Selection, build_plan


def _pb(stages: list[dict]) -> Playbook:
    return Playbook.model_validate({"name": "t", "stages": stages})


INV = Inventory.model_validate(
    {
        "hosts": {
            "a": {"connection": "local", "groups": ["gpu"]},
            "b": {"connection": "local", "groups": ["gpu"]},
            "pve": {"connection": "local"},
        },
        "groups": {"hyper": {"hosts": ["pve"]}},
    }
)
PB = _pb(
    [
        {"id": "one", "run": "true", "tags": ["setup"]},
        {"id": "two", "run": "true", "needs": ["one"]},
        {"id": "three", "run": "true", "needs": ["two"], "tags": ["setup"]},
        {"id": "fix", "run": "true", "hosts": ["hyper"]},
    ]
)


def test_everything_by_default() -> None:
    plan = build_plan(PB, INV, Selection())
    assert plan.hosts == ["a", "b", "pve"]
    assert plan.host_stages["a"] == ["one", "two", "three"]
    assert plan.host_stages["pve"] == ["one", "two", "three", "fix"]
    assert plan.graph("a") == {"one": set(), "two": {"one"}, "three": {"two"}}


def test_limit_by_group_and_pattern() -> None:
    assert build_plan(PB, INV, Selection.from_args(limit=["gpu"])).hosts == ["a", "b"]
    assert build_plan(PB, INV, Selection.from_args(limit=["p*"])).hosts == ["pve"]
    assert build_plan(PB, INV, Selection.from_args(limit=["b,a"])).hosts == ["b", "a"]


def test_only_drops_dependencies_on_unselected_stages() -> None:
    plan = build_plan(PB, INV, Selection.from_args(only=["three"], limit=["a"]))
    assert plan.host_stages["a"] == ["three"]
    assert plan.graph("a") == {"three": set()}


def test_only_by_tag_from_and_skip() -> None:
    plan = build_plan(PB, INV, Selection.from_args(only=["tag:setup"], limit=["a"]))
    assert plan.host_stages["a"] == ["one", "three"]
    plan = build_plan(PB, INV, Selection.from_args(from_="two", limit=["a"]))
    assert plan.host_stages["a"] == ["two", "three"]
    plan = build_plan(PB, INV, Selection.from_args(skip=["two"], limit=["a"]))
    assert plan.host_stages["a"] == ["one", "three"]


@pytest.mark.parametrize(
    ("sel", "fragment"),
    [
        (Selection.from_args(limit=["c"]), "matches no host"),
        (Selection.from_args(only=["tow"]), "did you mean 'two'"),
        (Selection.from_args(from_="thre"), "did you mean 'three'"),
        (Selection.from_args(skip=["tag:nope"]), "no stage has tag"),
        (Selection.from_args(only=["fix"], limit=["a"]), "nothing to do"),
    ],
)
def test_bad_selection_is_a_plan_error(sel: Selection, fragment: str) -> None:
    with pytest.raises(PlanError) as err:
        build_plan(PB, INV, sel)
    assert fragment in err.value.render()
    assert err.value.exit_code == 2


def test_cycle_is_a_plan_error() -> None:
    pb = _pb([
        {"id": "x", "run": "true", "needs": ["z"]},
        {"id": "y", "run": "true", "needs": ["x"]},
        {"id": "z", "run": "true", "needs": ["y"]},
    ])
    with pytest.raises(PlanError, match="cycle"):
        build_plan(pb, INV, Selection())


def test_playbook_hosts_is_the_default_target_of_its_stages() -> None:
    pb = Playbook.model_validate({"name": "t", "hosts": "gpu", "stages": [
        {"id": "s", "run": "true"}, {"id": "fix", "run": "true", "hosts": ["hyper"]}]})
    plan = build_plan(pb, INV, Selection())
    assert plan.host_stages == {"a": ["s"], "b": ["s"], "pve": ["fix"]}
