"""The registry of fact classes, filled by `@fact` on each class (by its probe name)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", bound=type)

#: probe name -> fact class
FACTS: dict[str, type] = {}


def fact(cls: T) -> T:
    """Register a fact class under its `probe` name (one class per probe)."""
    name = getattr(cls, "probe", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a `probe` class attribute")
    if name in FACTS and FACTS[name] is not cls:
        raise TypeError(f"probe {name!r} has two fact classes: {FACTS[name]} and {cls}")
    FACTS[name] = cls
    return cls
