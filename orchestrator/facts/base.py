"""The registry of fact classes, filled by `@fact` on each class (by its probe name)."""

from __future__ import annotations

from typing import Any, TypeVar

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


# Lenient readers of a probe's JSON: a missing or mistyped value reads as empty/None.
def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_whole(value: Any) -> int | None:
    """An int, or a float cut to one; None for anything else (bools included)."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_str(value: Any) -> str | None:
    return None if value is None else str(value)


def as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
