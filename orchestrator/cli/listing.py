"""`deploy/plan --list-hosts` and `--list-tasks`: what a run would touch, without connecting.

The CLI loads the playbook and inventory and builds the plan as a deploy does (the selection
applied: --limit, --only, --from, --skip); these render it. No connection is opened.
"""

from __future__ import annotations

import json

from orchestrator.config.model import HostSpec
from orchestrator.plan import Plan


def address(spec: HostSpec) -> str:
    """How a host is reached, as ssh would be told: `user@address:port`, or `local`."""
    if spec.connection == "local":
        return "local"
    user = f"{spec.user}@" if spec.user else ""
    port = f":{spec.port}" if spec.port else ""
    return f"{user}{spec.address or spec.name}{port}"


def run_order(plan: Plan, host: str) -> list[str]:
    """The host's stages in an order the run could take: playbook order, each stage after the
    stages it needs (the run itself starts independent stages at the same time)."""
    graph = plan.graph(host)
    pending, done, order = list(plan.host_stages[host]), set(), []
    while pending:
        ready = next((s for s in pending if graph[s] <= done), pending[0])
        pending.remove(ready)
        done.add(ready)
        order.append(ready)
    return order


def _stage_line(plan: Plan, n: int, sid: str) -> str:
    spec = plan.stages[sid]
    notes = [f"needs: {', '.join(sorted(plan.deps[sid]))}"] if plan.deps[sid] else []
    if spec.when is not None:
        notes.append(f"when: {spec.when}")
    if spec.tags:
        notes.append(f"tags: {', '.join(spec.tags)}")
    return f"  {n:>2}. {sid:<24} {spec.kind:<16} {'; '.join(notes)}".rstrip()


def list_hosts(plan: Plan, as_json: bool) -> list[str]:
    """One line per host the run would run on: its name and how it is reached."""
    specs = [plan.inventory.hosts[h] for h in plan.hosts]
    if as_json:
        return [json.dumps({"hosts": [{"name": s.name, "address": address(s),
                                       "connection": s.connection} for s in specs]}, indent=2)]
    width = max(len(h) for h in plan.hosts)
    return [f"{h:<{width}}  {address(s)}" for h, s in zip(plan.hosts, specs, strict=True)]


def list_tasks(plan: Plan, as_json: bool) -> list[str]:
    """The stages in run order: once when every host runs the same, else per set of hosts."""
    orders = {h: run_order(plan, h) for h in plan.hosts}
    if as_json:
        return [json.dumps({"hosts": orders}, indent=2)]
    same: dict[tuple[str, ...], list[str]] = {}
    for host, order in orders.items():
        same.setdefault(tuple(order), []).append(host)
    lines: list[str] = []
    for order, hosts in same.items():
        lines.append(f"{len(order)} stage(s) on {', '.join(hosts)}:")
        lines += [_stage_line(plan, n, sid) for n, sid in enumerate(order, 1)]
    return lines

