"""Playbook x hosts -> a DAG of (host, stage) nodes, with --limit/--only/--from/--skip applied.

Selection rules (documented in the README):
  --limit   host names, group names or shell patterns (comma separated); default every host.
  --only    stage ids or `tag:NAME` (comma separated): just these stages, dependencies NOT added.
  --from    this stage and every stage after it in playbook order.
  --skip    stage ids or `tag:NAME` to leave out.
A dependency on a stage that is not selected is dropped (the operator asserted it is done).
A stage's `hosts:` (names or groups), else the playbook's `hosts:`, limits where it runs.
A cycle is a PlanError.

`render_plan` is the step between plan and run: it renders every (host, stage) node for its
host (the `when:` condition, `env:`, `check:`, `run:` and `with:` templates, the params validated
by the kind's model) and collects the secrets to mask, so the runner only executes nodes. Every
template or param error of every node is collected into one located ConfigError (exit 2),
raised before any host is touched. Nothing in a playbook's templates depends on what a run finds
on a host: variables are the playbook's, the inventory's (host and group vars, vars files) and
the command line's, all known before the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import Any, Protocol

from orchestrator.config.kinds import stage_kinds
from orchestrator.config.model import Inventory, Playbook, StageSpec
from orchestrator.errors import ConfigError, ConfigProblem, PlanError
from orchestrator.logs import get_logger
from orchestrator.selection import Selection as Selection
from orchestrator.selection import hint as _hint
from orchestrator.selection import resolve_hosts as resolve_hosts

log = get_logger("orchestrator.plan")


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
        resolve_hosts(selection.limit, inventory, "--limit")
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
            if targets is None or h in resolve_hosts(targets, inventory, f"stage {sid}"):
                host_stages[h].append(sid)
    hosts = [h for h in hosts if host_stages[h]]
    if not hosts:
        raise PlanError("nothing to do: the selection leaves no (host, stage) to run")
    return Plan(playbook, inventory, hosts, stages, host_stages, deps)


# -- rendering: plan -> rendered nodes ---------------------------------------------------------


class SecretSink(Protocol):
    """Where secrets are registered as soon as they are known (orchestrator.redact.Redactor)."""

    def add(self, *values: Any) -> None: ...


@dataclass(frozen=True)
class Node:
    """One (host, stage) node rendered for its host: what the runner executes.

    `params` is the kind's validated Params model (None when `when:` is false: `skip_reason`
    says why); `check_cmd` the rendered `check:` command the runner runs first (None for `run:`
    stages, whose shell kind runs it itself); `env` the rendered `env:`.
    """

    host: str
    spec: StageSpec
    params: Any | None = None
    check_cmd: str | None = None
    skip_reason: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """The stage kind's YAML name."""
        return self.spec.kind


@dataclass
class RenderedPlan:
    """A plan with every (host, stage) node rendered, and the secrets each host's vars hold."""

    plan: Plan
    nodes: dict[str, dict[str, Node]]
    secrets: dict[str, set[str]]

    def node(self, host: str, sid: str) -> Node:
        """The rendered node of one stage on one host."""
        return self.nodes[host][sid]


def _problem(spec: StageSpec, message: str) -> ConfigProblem:
    return ConfigProblem(spec.location, f"stage {spec.id!r}: {message}")


def render_plan(
    plan: Plan, cli_vars: dict[str, Any] | None = None, secrets: SecretSink | None = None
) -> RenderedPlan:
    """Render every (host, stage) node; collect all template/param errors into one ConfigError.

    Each host's secret values go to `secrets` (the run's redactor) as soon as they are known,
    so that an error message rendered later is masked too.
    """
    from orchestrator.config.variables import host_variables, secret_values

    kinds = stage_kinds()
    problems: list[ConfigProblem] = []
    nodes: dict[str, dict[str, Node]] = {}
    host_secrets: dict[str, set[str]] = {}
    for host in plan.hosts:
        try:
            variables = host_variables(plan.playbook, plan.inventory, host, cli_vars or {})
        except ConfigError as exc:
            problems += exc.problems
            continue
        mine = host_secrets[host] = set(secret_values(plan.playbook, plan.inventory, variables))
        if secrets is not None:
            secrets.add(*mine)
        nodes[host] = {}
        for sid in plan.host_stages[host]:
            spec = plan.stages[sid]
            try:
                node = nodes[host][sid] = _render_node(host, spec, variables, kinds)
            except ConfigError as exc:
                problems += exc.problems
                continue
            if _secret_on_command_line(node, kinds, mine):
                warn_secret_on_command_line(host, sid)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return RenderedPlan(plan, nodes, host_secrets)


def _secret_on_command_line(node: Node, kinds: dict[str, Any], secrets: set[str]) -> bool:
    """A secret rendered into a shell command is on that shell's argv (`ps`, /proc/PID/cmdline)
    while it runs; the output is masked but the command line is not."""
    if node.params is None:
        return False
    texts = [getattr(node.params, name, None) for name in kinds[node.kind].shell_params]
    texts.append(node.check_cmd)
    values = [v for v in secrets if len(v) >= 4]
    return any(isinstance(t, str) and any(v in t for v in values) for t in texts)


def warn_secret_on_command_line(host: str, stage: str) -> None:
    """Say that a stage's command holds a secret (once per stage and host)."""
    log.warning("secret_on_command_line", host=host, stage=stage,
                hint="a secret is written into this stage's command, so any local user "
                "can read it in `ps` while it runs: pass it with `env:` (env: {TOKEN: "
                "\"{{ hf_token }}\"}) and use \"$TOKEN\" in the command")


def _render_node(
    host: str, spec: StageSpec, variables: dict[str, Any], kinds: dict[str, Any]
) -> Node:
    from orchestrator.config.loader import validate_params
    from orchestrator.config.templating import evaluate_condition, render_shell, render_value

    at = spec.location_of
    if spec.when is not None and not evaluate_condition(spec.when, variables, at("when")):
        return Node(host, spec, skip_reason=f"when: {spec.when} is false")
    kind = kinds.get(spec.kind)
    if kind is None:
        raise ConfigError([_problem(spec, f"unknown stage kind {spec.kind!r}")])
    env = {k: str(v) for k, v in render_value(spec.env, variables, at("env")).items()}
    check_cmd = render_shell(spec.check, variables, at("check")) if spec.check else None
    if spec.run is not None:
        params = kind.Params.model_validate({
            "command": render_shell(spec.run, variables, at("run")),
            "check": check_cmd,
            "env": env,
            "become": spec.become,
        })
        check_cmd = None  # the shell kind runs it itself
    else:
        with_ = dict(spec.with_)
        shell = {k: with_.pop(k) for k in kind.shell_params if isinstance(with_.get(k), str)}
        rendered = render_value(with_, variables, at("with"))
        for name, text in shell.items():  # command text: values shell-quoted, as in `run:`
            rendered[name] = render_shell(text, variables, at("with", name))
        params = validate_params(spec, rendered)
    return Node(host, spec, params=params, check_cmd=check_cmd, env=env)
