"""Playbook x hosts -> a DAG of (host, stage) nodes, with --limit/--only/--from/--skip applied.

Selection rules (documented in the README):
  --limit   host names, group names or shell patterns (comma separated); default every host.
  --only    stage ids or `tag:NAME` (comma separated): just these stages, dependencies NOT added.
  --from    this stage and every stage after it in playbook order.
  --skip    stage ids or `tag:NAME` to leave out.
A dependency on a stage that is not selected is dropped (the operator asserted it is done).
A stage's `hosts:` (names or groups), else the playbook's `hosts:`, limits where it runs.
A cycle is a PlanError.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter

from orchestrator.config.model import Inventory, Playbook, StageSpec
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


@dataclass
class Plan:
    """The selected hosts, and for each host its stages and their dependencies."""

    playbook: Playbook
    inventory: Inventory
    hosts: list[str]
    stages: dict[str, StageSpec]
    host_stages: dict[str, list[str]]
    deps: dict[str, set[str]]

    def graph(self, host: str) -> dict[str, set[str]]:
        """The dependency graph restricted to one host's stages."""
        mine = set(self.host_stages[host])
        return {s: self.deps[s] & mine for s in self.host_stages[host]}

    @property
    def node_count(self) -> int:
        """How many (host, stage) nodes the plan has."""
        return sum(len(v) for v in self.host_stages.values())


def _hint(name: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else None


def _resolve_hosts(patterns: list[str], inventory: Inventory, what: str) -> list[str]:
    names = list(inventory.hosts)
    groups = set(inventory.groups) | {g for h in inventory.hosts.values() for g in h.groups}
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
                hint=_hint(pat, [*names, *groups]) or f"hosts: {', '.join(names)}",
            )
        picked += [m for m in matches if m not in picked]
    return picked


def _match_stages(items: list[str], playbook: Playbook, flag: str) -> set[str]:
    ids = [s.id for s in playbook.stages]
    out: set[str] = set()
    for item in items:
        if item.startswith("tag:"):
            tag = item[4:]
            hits = {s.id for s in playbook.stages if tag in s.tags}
            if not hits:
                tags = sorted({t for s in playbook.stages for t in s.tags})
                raise PlanError(f"{flag}: no stage has tag {tag!r}", hint=_hint(tag, tags))
            out |= hits
        elif item in ids:
            out.add(item)
        else:
            raise PlanError(f"{flag}: no stage {item!r} in this playbook", hint=_hint(item, ids))
    return out


def build_plan(playbook: Playbook, inventory: Inventory, selection: Selection) -> Plan:
    """Apply the selection and return the plan; raise PlanError on a bad selection or a cycle."""
    hosts = (
        _resolve_hosts(selection.limit, inventory, "--limit")
        if selection.limit
        else list(inventory.hosts)
    )
    order = [s.id for s in playbook.stages]
    chosen = set(order)
    if selection.only:
        chosen = _match_stages(selection.only, playbook, "--only")
    if selection.from_:
        if selection.from_ not in order:
            raise PlanError(
                f"--from: no stage {selection.from_!r}", hint=_hint(selection.from_, order)
            )
        chosen &= set(order[order.index(selection.from_):])
    if selection.skip:
        chosen -= _match_stages(selection.skip, playbook, "--skip")
    stages = {s.id: s for s in playbook.stages if s.id in chosen}
    deps = {sid: set(spec.needs) & chosen for sid, spec in stages.items()}
    try:
        TopologicalSorter(deps).prepare()
    except CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise PlanError(f"dependency cycle between stages: {cycle}") from None

    host_stages: dict[str, list[str]] = {}
    for h in hosts:
        host_stages[h] = []
        for sid, spec in stages.items():
            targets = spec.hosts if spec.hosts is not None else playbook.hosts
            if targets is None or h in _resolve_hosts(targets, inventory, f"stage {sid}"):
                host_stages[h].append(sid)
    hosts = [h for h in hosts if host_stages[h]]
    if not hosts:
        raise PlanError("nothing to do: the selection leaves no (host, stage) to run")
    return Plan(playbook, inventory, hosts, stages, host_stages, deps)
