"""Variables of one host: layers, precedence, references between variables, secrets.

Precedence, lowest first (a later layer replaces a whole value of an earlier one; mappings are
not merged key by key):

1. playbook ``vars:``, then the playbook's ``vars_files:`` in order (a file's value replaces the
   playbook's; paths are relative to the playbook, e.g. a model profile in ``configs/models/``)
2. inventory ``vars:``
3. group ``vars:``, for each group of the inventory's ``groups:`` that holds the host, in the
   order the groups are written (a later group overrides an earlier one)
4. host ``vars:`` (after the inventory's ``defaults.vars``, which a host's own vars override)
5. ``--var NAME=VALUE`` on the command line (VALUE read as a YAML scalar: ``8`` is an int,
   ``true`` a bool, ``null`` None; anything else, including yes/no and dates, stays text)

Built-ins are always present and cannot be overridden (the loader rejects vars with these names):
``inventory_hostname`` (the host's inventory name), ``host`` (a dict: name, address - the
address, or the name when none is set -, port - None when unset -, user), ``group_names``
(the host's groups: those of ``groups:`` in inventory order, then those named only by the host)
and ``groups`` (every group's member names, in inventory order, as Ansible's magic variable:
e.g. a multi-node server's ``nodes: "{{ groups.gpu }}"``).

Values may refer to other variables (``venv: "{{ base_dir }}/venv"``); they are rendered in
dependency order, so the order of definition does not matter. A cycle (a refers to b, b to a) is a
located `ConfigError`. Every variable is rendered for every host, so a variable must be renderable
on every host even when only some stages use it.
"""

from __future__ import annotations

import difflib
import graphlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.config.model import HostSpec, Inventory, Playbook
from orchestrator.config.templating import is_template, render_value, undeclared
from orchestrator.config.yamlsrc import parse_scalar
from orchestrator.errors import ConfigError, ConfigProblem, Location
from orchestrator.redact import is_secret_name

BUILTINS = ("inventory_hostname", "host", "group_names", "groups")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_cli_vars(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``--var NAME=VALUE`` items; VALUE is read as a YAML scalar. All errors together."""
    result: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            problems.append(ConfigProblem(
                None, f"--var {item!r}: expected NAME=VALUE",
                f"write it as --var {name or 'name'}=VALUE",
            ))
            continue
        if not _NAME.match(name):
            problems.append(ConfigProblem(
                None, f"--var {item!r}: {name!r} is not a variable name",
                "use letters, digits and '_', not starting with a digit",
            ))
            continue
        if name in BUILTINS:
            problems.append(ConfigProblem(
                None, f"--var {item!r}: {name!r} is a built-in variable and cannot be set",
                "choose another name",
            ))
            continue
        result[name] = parse_scalar(value)
    if problems:
        raise ConfigError(problems)
    return result


def group_names(inventory: Inventory, host_name: str) -> list[str]:
    """The groups of a host: inventory `groups:` order first, then groups named only by the host."""
    names = [g for g in inventory.groups if host_name in inventory.group_members(g)]
    spec = inventory.hosts.get(host_name)
    if spec is not None:
        names += [g for g in spec.groups if g not in names]
    return names


def builtin_variables(inventory: Inventory, host_name: str) -> dict[str, Any]:
    """The built-in variables of one host."""
    spec = inventory.hosts[host_name]
    return {
        "inventory_hostname": host_name,
        "host": {
            "name": host_name,
            "address": spec.address or host_name,
            "port": spec.port,
            "user": spec.user,
        },
        "group_names": group_names(inventory, host_name),
        "groups": {g: inventory.group_members(g) for g in _all_groups(inventory)},
    }


def _all_groups(inventory: Inventory) -> list[str]:
    """Group names: the inventory's `groups:` in order, then those named only by hosts."""
    names = list(inventory.groups)
    for spec in inventory.hosts.values():
        names += [g for g in spec.groups if g not in names]
    return names


def _layers(
    playbook: Playbook, inventory: Inventory, spec: HostSpec, cli_vars: Mapping[str, Any]
) -> list[tuple[Mapping[str, Any], Any]]:
    """(values, owner) pairs, lowest precedence first; owner locates values (None for CLI)."""
    layers: list[tuple[Mapping[str, Any], Any]] = [
        (playbook.vars, playbook), (inventory.vars, inventory)
    ]
    for name, group in inventory.groups.items():
        if spec.name in inventory.group_members(name):
            layers.append((group.vars, group))
    layers.append((spec.vars, spec))
    layers.append((cli_vars, None))
    return layers


def raw_variable(playbook: Playbook, inventory: Inventory, host_name: str, name: str) -> Any:
    """The value of variable NAME for one host as written (templates not rendered), from the
    highest layer that sets it, --var aside; None when none does."""
    value = None
    for values, _owner in _layers(playbook, inventory, inventory.hosts[host_name], {}):
        if name in values:
            value = values[name]
    return value


def _references(value: Any) -> set[str]:
    """Variable names read by the templates inside a value."""
    found: set[str] = set()
    if isinstance(value, str):
        if is_template(value):
            try:
                found |= undeclared(value)
            except ConfigError:
                pass  # reported when rendered, with its location
    elif isinstance(value, Mapping):
        for v in value.values():
            found |= _references(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= _references(v)
    return found


def host_variables(
    playbook: Playbook,
    inventory: Inventory,
    host_name: str,
    cli_vars: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """All variables of one host, rendered, plus the built-ins (see the module docstring)."""
    if host_name not in inventory.hosts:
        close = difflib.get_close_matches(host_name, list(inventory.hosts), n=3)
        raise ConfigError([ConfigProblem(
            None, f"unknown host {host_name!r}",
            f"did you mean {close[0]!r}?" if close else
            "known hosts: " + ", ".join(sorted(inventory.hosts)),
        )])
    spec = inventory.hosts[host_name]
    raw: dict[str, Any] = {}
    origin: dict[str, Location | None] = {}
    for values, owner in _layers(playbook, inventory, spec, cli_vars or {}):
        for name, value in values.items():
            raw[name] = value
            origin[name] = owner.location_of("vars", name) if owner is not None else None
    builtins = builtin_variables(inventory, host_name)
    for name in BUILTINS:
        raw.pop(name, None)

    graph = {name: sorted(_references(value) & raw.keys()) for name, value in raw.items()}
    sorter = graphlib.TopologicalSorter(graph)
    try:
        order = list(sorter.static_order())
    except graphlib.CycleError as exc:
        cycle = list(reversed(exc.args[1]))
        raise ConfigError([ConfigProblem(
            origin.get(cycle[0]),
            "variables refer to each other in a cycle: " + " -> ".join(cycle),
            "break the cycle: one of these variables must not use the others",
        )]) from None

    context: dict[str, Any] = {**raw, **builtins}
    for name in order:
        value = raw[name]
        rendered = render_value(value, context, origin.get(name))
        context[name] = rendered
    return context


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            yield from _leaves(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def _secret_leaves(name: Any, value: Any, listed: set[str], top: bool) -> Iterable[str]:
    is_secret = (top and name in listed) or (isinstance(name, str) and is_secret_name(name))
    if is_secret:
        yield from _leaves(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _secret_leaves(k, v, listed, False)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _secret_leaves(None, v, listed, False)


def secret_values(
    playbook: Playbook,
    inventory: Inventory | None,
    variables: Mapping[str, Any] | None = None,
) -> set[str]:
    """Values to redact: vars listed under `secrets:` (playbook or inventory), vars (or keys
    inside dict vars) whose names look secret (TOKEN, KEY, SECRET, PASSWORD), values read by
    `!env` from secret-looking environment variables, and hosts' `become_password`.

    `variables` is one host's rendered variables (from `host_variables`); when None, the raw
    vars of every layer and every host are used instead.
    """
    listed = set(playbook.secrets) | set(inventory.secrets if inventory else [])
    found: set[str] = set(playbook._secret_values)
    layers: list[Mapping[str, Any]] = []
    if variables is not None:
        layers.append(variables)
    else:
        layers.append(playbook.vars)
        if inventory is not None:
            layers.append(inventory.vars)
            layers.extend(g.vars for g in inventory.groups.values())
            layers.extend(h.vars for h in inventory.hosts.values())
    for layer in layers:
        for name, value in layer.items():
            found.update(_secret_leaves(name, value, listed, True))
    if inventory is not None:
        found |= inventory._secret_values
        found.update(h.become_password for h in inventory.hosts.values() if h.become_password)
    found.discard("")
    return found


def referenced_names(playbook: Playbook, inventory: Inventory) -> set[str]:
    """Every variable name a template reads: in the stages (`run`, `check`, `with`, `env`, the
    `when:` expression) and in the values of every vars layer (playbook and its vars files,
    inventory, groups, hosts)."""
    found: set[str] = set()
    for spec in playbook.stages:
        found |= _references([spec.run, spec.check, spec.with_, spec.env])
        if spec.when is not None:
            try:
                found |= undeclared(spec.when, expression=not is_template(spec.when))
            except ConfigError:
                pass  # reported when rendered, with its location
    layers = [playbook.vars, inventory.vars, *(g.vars for g in inventory.groups.values()),
              *(h.vars for h in inventory.hosts.values())]
    for values in layers:
        found |= _references(values)
    return found


def unknown_variables(
    playbook: Playbook, inventory: Inventory, names: Iterable[str]
) -> dict[str, str | None]:
    """The NAMES (e.g. of `--var`) that no vars layer defines and no template reads, each with
    its nearest known name (difflib) or None: a typo'd `--var sglang_prot=1` changes nothing.

    Names that a layer defines are settled without parsing a template, so the usual case (every
    `--var` overrides a defined variable) costs nothing.
    """
    defined = set(playbook.vars) | set(inventory.vars)
    defined.update(n for g in inventory.groups.values() for n in g.vars)
    defined.update(n for h in inventory.hosts.values() for n in h.vars)
    left = [n for n in dict.fromkeys(names) if n not in defined and n not in BUILTINS]
    if not left:
        return {}
    known = defined | referenced_names(playbook, inventory)
    out: dict[str, str | None] = {}
    for name in (n for n in left if n not in known):
        close = difflib.get_close_matches(name, sorted(known - set(BUILTINS)), n=1, cutoff=0.6)
        out[name] = close[0] if close else None
    return out
