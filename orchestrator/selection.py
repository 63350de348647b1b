"""What a deploy is asked to touch: the command line's selection (--limit, --only, --from,
--skip) and the hosts that host patterns name in an inventory.

Stdlib only: the configuration models (orchestrator.config.model) use its group rule, the plan
(orchestrator.plan) and the early connections (orchestrator.preconnect) its host patterns.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.errors import PlanError


def _split(values: Iterable[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [p.strip() for p in v.split(",") if p.strip()]
    return out


@dataclass
class Selection:
    """What the operator asked for on the command line."""

    limit: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    from_: str | None = None
    skip: list[str] = field(default_factory=list)

    @classmethod
    def from_args(
        cls,
        limit: Iterable[str] | None = None,
        only: Iterable[str] | None = None,
        from_: str | None = None,
        skip: Iterable[str] | None = None,
    ) -> Selection:
        """Build from repeatable, comma-separated CLI values."""
        return cls(_split(limit), _split(only), from_, _split(skip))


class HostTable(Protocol):
    """An inventory as host patterns see it (orchestrator.config.model.Inventory)."""

    @property
    def hosts(self) -> Mapping[str, Any]:
        """Host name -> its spec (with `groups`, the groups it names itself)."""

    @property
    def source(self) -> str | None:
        """The file it was read from."""

    def group_names(self) -> set[str]:
        """Every group: those under `groups:` and those hosts name."""

    def group_members(self, group: str) -> list[str]:
        """Host names in a group."""


def members(group: str, listed: Iterable[str], host_groups: Mapping[str, Iterable[str]]
            ) -> list[str]:
    """Host names in GROUP: LISTED (its `groups.X.hosts`), then the hosts that name it in
    their own `groups` (HOST_GROUPS: host name -> its groups)."""
    out = list(listed)
    out += [n for n, groups in host_groups.items() if group in groups and n not in out]
    return out


def hint(name: str, choices: Iterable[str]) -> str | None:
    """"did you mean ...?" for the closest of CHOICES to NAME, if any is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else None


def resolve_hosts(patterns: list[str], inventory: HostTable, what: str) -> list[str]:
    """The inventory hosts PATTERNS name (hosts, groups, fnmatch patterns), in order; PlanError
    names the pattern (WHAT says where it was written) that matches nothing."""
    names = list(inventory.hosts)
    groups = inventory.group_names()
    picked: list[str] = []
    for pat in patterns:
        if pat in inventory.hosts:
            matches = [pat]
        elif pat in groups:
            matches = inventory.group_members(pat)
        else:
            matches = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not matches:
            raise PlanError(
                f"{what} {pat!r} matches no host or group in {inventory.source or 'the inventory'}",
                hint=hint(pat, [*names, *groups]) or f"hosts: {', '.join(names)}",
            )
        picked += [m for m in matches if m not in picked]
    return picked
