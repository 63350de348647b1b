"""Typed host facts: one frozen dataclass per thing read from a host, parsed in ONE place.

A fact class names the agent probe that answers it and turns the answer (JSON) into typed
fields; stages, service commands and the preflight read hosts only through these types:

    status = host.fact(ServerStatus, state_dir="/opt/orchestrator/run")
    if status.process.same_process: ...

Adding a fact: copy orchestrator/facts/server.py's pattern (a frozen dataclass with
`probe: ClassVar[str]` and `from_answer(answer) -> Self`), then record real answers as test data
under tests/facts/<probe>/<case>.json ({"answer": ..., "fact": the expected fields}); the
data-driven test tests/facts/test_facts.py parses every one (pyinfra: tests/facts/).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any, ClassVar, Protocol, TypeVar

F = TypeVar("F", bound="HostFact")


class HostFact(Protocol):
    """What `Host.fact` needs of a fact class."""

    probe: ClassVar[str]

    @classmethod
    def from_answer(cls: type[F], answer: Any) -> F: ...


def to_data(fact: Any) -> Any:
    """A fact as plain data (dataclasses -> dicts, tuples -> lists), for records and tests.

    One pass over the fields, where `dataclasses.asdict` (then a second pass over its copy)
    deep-copied every value: a converged 16-host run spent ~0.1 s of CPU on it."""
    if isinstance(fact, dict):
        return {k: to_data(v) for k, v in fact.items()}
    if isinstance(fact, (list, tuple)):
        return [to_data(v) for v in fact]
    if is_dataclass(fact) and not isinstance(fact, type):
        return {name: to_data(getattr(fact, name)) for name in _field_names(type(fact))}
    return fact


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def registry() -> dict[str, type]:
    """Every fact class by its probe name (imports every module of this package)."""
    import importlib
    import pkgutil

    from orchestrator.facts import base

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(base.FACTS)
