"""Load playbooks and inventories: YAML -> validated models, every problem located, all at once.

Public API:

- `load_playbook(path) -> Playbook`
- `load_inventory(path) -> Inventory`: our YAML format, or an Ansible INI or YAML inventory with
  its group_vars/ and host_vars/ (`config.ansible`), translated to ours with its locations kept
- `load_all(playbook_path, inventory_path, cli_vars=None) -> (Playbook, Inventory)`: both files,
  plus the checks that need both (hosts named by stages, undefined template variables); the
  problems of BOTH files come in one `ConfigError`.
- `validate_params(stage, rendered_params) -> Params`: for the runner, after rendering `with:`
  per host; errors located at the stage's `with:` values.

Each file is read by `config.yamlsrc` (locations, duplicate keys, input bounds, `!env`), then
validated by the pydantic models of `config.model`; each pydantic error is mapped back to the
place it concerns (the unknown key, the wrong value, or for a missing key the mapping that lacks
it) and worded for an operator, with a hint (did you mean ...?). Cross-checks run on the raw data,
so they still run when some stage is malformed, and all of them are collected:

- duplicate stage ids, `needs` naming unknown stages, dependency cycles (graphlib);
- `uses:` naming an unknown stage kind; `with:` validated against the kind's `Params` (a value
  holding ``{{`` is rendered later, so it is not type-checked here);
- template syntax (and unknown filters) in run/check/when/with/env/vars values;
- with an inventory: `hosts:` naming unknown hosts or groups, and template variables that no host
  would define (vars of the playbook, inventory, groups, hosts, `--var`, and the built-ins);
- inventory: groups listing unknown hosts, hypervisors that are not inventory hosts, names used
  for both a host and a group, vars named like built-ins or not usable in templates.

Loaded objects carry `_location` (and `location_of(*path)` for values inside them);
`Playbook`/`Inventory` carry `_source`; `HostSpec.name` is its key; the inventory's `defaults:`
are applied to each host (a host's own settings win; `vars` are merged key by key).
"""

from __future__ import annotations

import copy
import difflib
import graphlib
import os
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError

from orchestrator.config.ansible import read_inventory as read_ansible_or_ours
from orchestrator.config.kinds import stage_kinds
from orchestrator.config.model import HostSpec, Inventory, Playbook, StageSpec
from orchestrator.config.templating import (
    check_template,
    is_template,
    quoted_expressions,
    undeclared,
)
from orchestrator.config.variables import BUILTINS
from orchestrator.config.yamlsrc import YamlDoc, load_yaml
from orchestrator.errors import ConfigError, ConfigProblem, Location

Path_ = tuple[Any, ...]
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JINJA_RESERVED = frozenset(
    "self loop varargs kwargs caller super true false none True False None and or not in is if "
    "else for endfor set block import include from as with recursive".split()
)

# What a field holds, in words, where the type alone says too little.
_EXPECT: dict[tuple[str, str], str] = {
    ("StageSpec", "needs"): "a list of stage ids",
    ("StageSpec", "hosts"): "a list of host or group names",
    ("StageSpec", "tags"): "a list of tags",
    ("StageSpec", "env"): "a mapping of environment variable names to values",
    ("StageSpec", "with"): "a mapping of parameters for the stage kind",
    ("StageSpec", "retry"): "a mapping (attempts, delay, backoff, max_delay, on)",
    ("StageSpec", "run"): "a shell command (text)",
    ("StageSpec", "check"): "a shell command (text)",
    ("StageSpec", "when"): "a condition (text such as `gpu_count > 4`, or true/false)",
    ("Playbook", "stages"): "a list of stages",
    ("Playbook", "secrets"): "a list of variable names",
    ("Inventory", "secrets"): "a list of variable names",
    ("Inventory", "hosts"): "a mapping of host names to host settings",
    ("Inventory", "groups"): "a mapping of group names to {hosts, vars}",
    ("Inventory", "defaults"): "a mapping of host settings",
    ("GroupSpec", "hosts"): "a list of host names",
    ("HostSpec", "groups"): "a list of group names",
    ("RetrySpec", "on"): "a list of 'connection' and/or exit codes",
}
_VARS_EXPECT = "a mapping of variable names to values"


# -- public API -------------------------------------------------------------------------------


def load_playbook(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Playbook:
    """Load and validate one playbook; raise ConfigError with every problem found."""
    session = _Session(environ)
    doc = session.read(path)
    playbook = session.playbook(doc, None) if doc is not None else None
    session.finish()
    assert playbook is not None
    return playbook


def load_playbook_alone(
    path: str | os.PathLike[str],
    cli_vars: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[Playbook, list[tuple[Location, str]]]:
    """Load a playbook without an inventory, checking its template variables as far as that
    can: a name that no variable defines and that is a near miss of one (`workdri` for
    `workdir`) is an error, as no inventory would fix the typo; the other undefined names are
    returned with their locations: an inventory, a group, a host or `--var` must define them.
    """
    session = _Session(environ)
    doc = session.read(path)
    facts = _InventoryFacts()
    facts.standalone = True
    facts.var_names |= set(cli_vars or {})
    playbook = session.playbook(doc, facts) if doc is not None else None
    session.finish()
    assert playbook is not None
    return playbook, list(dict.fromkeys(session.needs))


def load_inventory(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Inventory:
    """Load and validate one inventory; raise ConfigError with every problem found."""
    session = _Session(environ)
    doc = session.read_inventory(path)
    inventory = session.inventory(doc) if doc is not None else None
    session.finish()
    assert inventory is not None
    return inventory


def load_all(
    playbook_path: str | os.PathLike[str],
    inventory_path: str | os.PathLike[str],
    cli_vars: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[Playbook, Inventory]:
    """Load a playbook and an inventory together; one ConfigError lists the problems of both."""
    session = _Session(environ)
    pb_doc = session.read(playbook_path)
    inv_doc = session.read_inventory(inventory_path)
    inventory = session.inventory(inv_doc) if inv_doc is not None else None
    facts = _InventoryFacts.from_data(inv_doc.data if inv_doc is not None else None)
    for name in cli_vars or {}:
        if name in BUILTINS:
            session.add(None, f"--var {name}: {name!r} is a built-in variable",
                        "choose another name")
    facts.var_names |= set(cli_vars or {})
    playbook = session.playbook(pb_doc, facts) if pb_doc is not None else None
    if inv_doc is not None and isinstance(inv_doc.data, dict):
        known = set(facts.var_names)
        if pb_doc is not None and isinstance(pb_doc.data, dict):
            known |= _keys(pb_doc.data.get("vars"))
        checker = _Checker(session, inv_doc)
        for path, values in _inventory_var_layers(inv_doc.data):
            checker.check_templates(path, values, known)
    session.finish()
    assert playbook is not None and inventory is not None
    return playbook, inventory


def validate_params(
    stage: StageSpec,
    params: Mapping[str, Any],
    model: type[BaseModel] | None = None,
) -> BaseModel:
    """Validate a stage's rendered `with:` params against its kind's `Params` (or `model`).

    For the runner, after rendering per host: errors are located at the `with:` values of the
    stage as written in the playbook (or at the stage), worded like load-time errors.
    """
    if model is None:
        kinds = stage_kinds()
        if stage.kind not in kinds:
            raise ConfigError([ConfigProblem(stage.location, f"stage '{stage.id}': unknown "
                                             f"stage kind '{stage.kind}'")])
        model = kinds[stage.kind].Params
    source = stage.location.file if stage.location else "<playbook>"
    doc = YamlDoc(source=source, data={"stages": [{"id": stage.id, "with": dict(params)}]})
    base = ("stages", 0)
    if stage.location is not None:
        doc.locations[base] = stage.location
    for rel, loc in stage._field_locations.items():
        doc.locations[base + rel] = loc
    session = _Session(None)
    result = _Checker(session, doc).validate(model, dict(params), prefix=(*base, "with"))
    session.finish()
    return result


# -- session: collects problems across files --------------------------------------------------


class _InventoryFacts:
    """What playbook checks need to know of an inventory, read tolerantly from its raw data."""

    def __init__(self) -> None:
        self.present = False
        #: no inventory at all (validate without -i): only near misses are errors
        self.standalone = False
        self.hosts: list[str] = []
        self.groups: list[str] = []
        self.var_names: set[str] = set(BUILTINS)

    @classmethod
    def from_data(cls, data: Any) -> _InventoryFacts:
        facts = cls()
        if not isinstance(data, dict):
            return facts
        facts.present = True
        hosts = data.get("hosts")
        groups = data.get("groups")
        facts.var_names |= _keys(data.get("vars"))
        defaults = data.get("defaults")
        if isinstance(defaults, dict):
            facts.var_names |= _keys(defaults.get("vars"))
        if isinstance(hosts, dict):
            facts.hosts = [str(h) for h in hosts]
            for spec in hosts.values():
                if isinstance(spec, dict):
                    facts.var_names |= _keys(spec.get("vars"))
                    declared = spec.get("groups")
                    declared = [declared] if isinstance(declared, str) else declared
                    if isinstance(declared, list):
                        facts.groups += [g for g in declared if isinstance(g, str)]
        if isinstance(groups, dict):
            facts.groups = [str(g) for g in groups] + facts.groups
            for spec in groups.values():
                if isinstance(spec, dict):
                    facts.var_names |= _keys(spec.get("vars"))
        facts.groups = list(dict.fromkeys(facts.groups))
        return facts


def _keys(value: Any) -> set[str]:
    return {str(k) for k in value} if isinstance(value, dict) else set()


class _Session:
    """One load: reads files, validates, cross-checks, and gathers every problem."""

    def __init__(self, environ: Mapping[str, str] | None) -> None:
        self.environ = environ
        self.problems: list[ConfigProblem] = []
        self.sources: list[str] = []
        #: variables a playbook uses that only an inventory (or --var) can define
        self.needs: list[tuple[Location, str]] = []

    def add(self, location: Location | None, message: str, hint: str | None = None) -> None:
        self.problems.append(ConfigProblem(location, message, hint))

    def finish(self) -> None:
        if not self.problems:
            return
        order = {s: i for i, s in enumerate(self.sources)}

        def key(p: ConfigProblem) -> tuple[int, int, int]:
            if p.location is None:
                return (-1, 0, 0)
            return (order.get(p.location.file, len(order)), p.location.line, p.location.column)

        unique = list(dict.fromkeys(self.problems))
        raise ConfigError(sorted(unique, key=key))

    def read(self, path: str | os.PathLike[str]) -> YamlDoc | None:
        self.sources.append(str(path))
        try:
            return load_yaml(path, environ=self.environ)
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return None

    def read_inventory(self, path: str | os.PathLike[str]) -> YamlDoc | None:
        """Our inventory format as read, or an Ansible one (INI, YAML) as our format's data."""
        self.sources.append(str(path))
        try:
            doc, problems = read_ansible_or_ours(path, environ=self.environ)
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return None
        self.problems.extend(problems)
        return doc

    # -- playbook ------------------------------------------------------------------------------

    def playbook(self, doc: YamlDoc, facts: _InventoryFacts | None) -> Playbook | None:
        data = doc.data
        if data is None:
            self.add(doc.loc(), "the playbook file is empty",
                     "a playbook needs at least `name:` and `stages:`")
            return None
        if not isinstance(data, dict):
            self.add(doc.loc(), f"a playbook must be a mapping, got {_got(data)}",
                     "write `name: ...` and `stages: [...]` at the top level")
            return None
        data = _without_extensions(data)
        data = self._merge_vars_files(doc, data)
        checker = _Checker(self, doc)
        playbook = checker.validate(Playbook, data)
        checker.check_vars(("vars",), data.get("vars"))
        stages = data.get("stages")
        if isinstance(stages, list):
            checker.check_stages(stages, facts)
        if facts is not None and (facts.present or facts.standalone):
            checker.lenient = facts.standalone
            checker.check_undefined(data, facts.var_names | _keys(data.get("vars")))
        if playbook is not None:
            _attach(playbook, doc, ())
            playbook._source = doc.source
            playbook._secret_values = set(doc.secrets)
        return playbook

    def _merge_vars_files(self, doc: YamlDoc, data: dict[str, Any]) -> dict[str, Any]:
        """Merge `vars_files:` (paths relative to the playbook) over the playbook's `vars:`.

        Later files win over earlier ones and over `vars:`; every merged value keeps the
        location of the file it came from, so later errors name that file.
        """
        files = data.get("vars_files")
        if files is None:
            return data
        if isinstance(files, str):
            files = [files]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            self.add(doc.loc(("vars_files",)), "`vars_files:` must be a list of file paths",
                     "e.g. vars_files: [../configs/models/kimi-k2.6.yaml]")
            return {k: v for k, v in data.items() if k != "vars_files"}
        own = data.get("vars")
        merged: dict[str, Any] = dict(own) if isinstance(own, dict) else {}
        base = os.path.dirname(os.path.abspath(doc.source))
        for i, rel in enumerate(files):
            path = rel if os.path.isabs(rel) else os.path.join(base, rel)
            if not os.path.exists(path):
                self.add(doc.loc(("vars_files", i)), f"vars file not found: {path}",
                         "paths in `vars_files:` are relative to the playbook")
                continue
            fdoc = self.read(path)
            if fdoc is None:
                continue
            if fdoc.data is None:
                continue
            if not isinstance(fdoc.data, dict):
                self.add(fdoc.loc(), f"a vars file must be a mapping, got {_got(fdoc.data)}")
                continue
            for key, value in fdoc.data.items():
                merged[key] = value
                for table, src in ((doc.locations, fdoc.locations),
                                   (doc.key_locations, fdoc.key_locations)):
                    for sub in [p for p in table if len(p) > 1 and p[:2] == ("vars", key)]:
                        del table[sub]
                    for p, loc in src.items():
                        if p and p[0] == key:
                            table[("vars", *p)] = loc
            doc.secrets |= fdoc.secrets
        data = {**data, "vars": merged, "vars_files": files}
        doc.data = data
        return data

    # -- inventory -----------------------------------------------------------------------------

    def inventory(self, doc: YamlDoc) -> Inventory | None:
        data = doc.data
        if data is None:
            self.add(doc.loc(), "the inventory file is empty",
                     "an inventory needs `hosts:` with at least one host")
            return None
        if not isinstance(data, dict):
            self.add(doc.loc(), f"an inventory must be a mapping, got {_got(data)}",
                     "write `hosts:` (and optionally groups, vars, defaults) at the top level")
            return None
        checker = _Checker(self, doc)
        data = _without_extensions(data)
        hosts = data.get("hosts")
        if isinstance(hosts, dict):
            hosts = {k: ({} if v is None else v) for k, v in hosts.items()}
            for name, spec in hosts.items():
                if isinstance(spec, dict):
                    if "name" in spec and spec["name"] != name:
                        self.add(doc.key_loc(("hosts", name, "name")),
                                 f"host {name!r}: `name:` differs from the host's key",
                                 "a host's name is its key; remove `name:`")
                    hosts[name] = {**spec, "name": name}
            data["hosts"] = hosts
        defaults = data.get("defaults")
        if isinstance(defaults, dict) and defaults:
            ok = checker.validate(HostSpec, defaults, prefix=("defaults",)) is not None
            if "name" in defaults:
                self.add(doc.key_loc(("defaults", "name")), "`defaults:` cannot set `name`",
                         "a host's name is its key; remove `name:` from defaults")
                ok = False
            if ok and isinstance(hosts, dict):
                _apply_defaults(doc, hosts, defaults)
        inventory = checker.validate(Inventory, data)
        checker.check_inventory(data)
        for path, values in _inventory_var_layers(data):
            checker.check_vars(path, values)
        if inventory is not None:
            _attach(inventory, doc, ())
            for name, host in inventory.hosts.items():
                host._location = doc.key_loc(("hosts", name))
            for name, group in inventory.groups.items():
                group._location = doc.key_loc(("groups", name))
            inventory._source = doc.source
            inventory._secret_values = set(doc.secrets)
        return inventory


def _without_extensions(data: dict[str, Any]) -> dict[str, Any]:
    """Drop top-level `x-...` keys: a place for YAML anchors (`x-retry: &retry {...}`)."""
    return {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}


def _inventory_var_layers(data: dict[str, Any]) -> list[tuple[Path_, Any]]:
    layers: list[tuple[Path_, Any]] = [(("vars",), data.get("vars"))]
    for section in ("groups", "hosts"):
        entries = data.get(section)
        if isinstance(entries, dict):
            for name, spec in entries.items():
                if isinstance(spec, dict):
                    layers.append(((section, name, "vars"), spec.get("vars")))
    defaults = data.get("defaults")
    if isinstance(defaults, dict):
        layers.append((("defaults", "vars"), defaults.get("vars")))
    return layers


def _apply_defaults(doc: YamlDoc, hosts: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Fill each host's missing settings from `defaults:` (vars merged key by key)."""
    sub: dict[Any, list[tuple[Path_, Location]]] = {}
    for path, loc in doc.locations.items():
        if len(path) >= 2 and path[0] == "defaults":
            sub.setdefault(path[1], []).append((path[2:], loc))
    for name, spec in hosts.items():
        if not isinstance(spec, dict):
            continue
        merged = dict(spec)
        for key, value in defaults.items():
            if key == "vars" and isinstance(value, dict) and isinstance(spec.get("vars"), dict):
                merged["vars"] = {**copy.deepcopy(value), **spec["vars"]}
                for rest, loc in sub.get(key, []):
                    if rest and rest[0] not in spec["vars"]:
                        doc.locations.setdefault(("hosts", name, key, *rest), loc)
            elif key not in spec:
                merged[key] = copy.deepcopy(value)
                for rest, loc in sub.get(key, []):
                    doc.locations.setdefault(("hosts", name, key, *rest), loc)
        hosts[name] = merged


# -- validation and checks ----------------------------------------------------------------------


class _Checker:
    """Validation and cross-checks of one document, reporting into a session."""

    def __init__(self, session: _Session, doc: YamlDoc) -> None:
        self.session = session
        self.doc = doc
        #: no inventory: an undefined name is noted (session.needs), not an error, unless it
        #: is a near miss of a defined one
        self.lenient = False

    def add(self, location: Location | None, message: str, hint: str | None = None) -> None:
        self.session.add(location, message, hint)

    # pydantic -------------------------------------------------------------------------------

    def validate(
        self,
        model: type[BaseModel],
        data: Any,
        prefix: Path_ = (),
        skip_templates: bool = False,
    ) -> Any:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            self.report(exc, model, prefix, data, skip_templates)
        except Exception as exc:  # a kind's own validator misbehaving: still located
            self.add(self.doc.loc(prefix), f"{_where(self.doc, prefix)}: invalid: {exc}")
        return None

    def report(
        self,
        exc: ValidationError,
        model: type[BaseModel],
        prefix: Path_,
        data: Any,
        skip_templates: bool,
    ) -> None:
        seen: set[Path_] = set()
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            if skip_templates and (_templated(data, loc) or _holds_template(_at(data, loc))):
                continue  # validated once rendered (a list validator sees "x=={{ v }}" here)
            real, location, message, hint = _translate(self.doc, err, model, prefix, loc)
            key = prefix + loc if err["type"] in ("missing", "extra_forbidden") else real
            if key in seen:  # a union reports once per member: keep one
                continue
            seen.add(key)
            self.add(location, message, hint)

    # vars ---------------------------------------------------------------------------------------

    def check_vars(self, path: Path_, values: Any) -> None:
        if not isinstance(values, dict):
            return
        for name in values:
            key = (*path, name)
            if name in BUILTINS:
                self.add(self.doc.key_loc(key), f"'{name}' is a built-in variable and cannot be "
                         "set", f"choose another name; built-ins are: {', '.join(BUILTINS)}")
            elif name in _JINJA_RESERVED:
                self.add(self.doc.key_loc(key),
                         f"variable name '{name}' is reserved by the template language",
                         f"choose another name, e.g. '{name}_value'")
            elif not isinstance(name, str) or not _VAR_NAME.match(name):
                self.add(self.doc.key_loc(key),
                         f"variable name {name!r} cannot be used in templates",
                         "use letters, digits and '_', not starting with a digit "
                         f"(e.g. {re.sub(r'[^A-Za-z0-9_]', '_', str(name))!r})")
        self.check_templates(path, values, None)

    def check_templates(self, path: Path_, value: Any, known: set[str] | None,
                        expression: bool = False) -> None:
        """Syntax of every template inside `value`; with `known`, also undefined names."""
        if isinstance(value, dict):
            for k, v in value.items():
                self.check_templates((*path, k), v, known)
            return
        if isinstance(value, list):
            for i, v in enumerate(value):
                self.check_templates((*path, i), v, known)
            return
        if not isinstance(value, str) or not (expression or is_template(value)):
            return
        problem = check_template(value, expression=expression)
        location = self.doc.loc(path)
        if problem is not None:
            if known is None:  # report syntax once (the undefined pass skips it)
                self.add(location, f"{_where(self.doc, path)}: {problem.message}", problem.hint)
            return
        if known is None:
            return
        for name in sorted(undeclared(value, expression=expression) - known):
            close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.6)
            if self.lenient and not close:  # an inventory or --var may define it
                self.session.needs.append((location, name))
                continue
            hint = (f"did you mean '{close[0]}'?" if close else
                    f"define '{name}' under `vars:` (playbook, inventory, group or host) "
                    f"or pass `--var {name}=VALUE`")
            self.add(location, f"{_where(self.doc, path)}: undefined variable '{name}'", hint)

    def check_undefined(self, data: dict[str, Any], known: set[str]) -> None:
        self.check_templates(("vars",), data.get("vars"), known)
        stages = data.get("stages")
        if not isinstance(stages, list):
            return
        for i, stage in enumerate(stages):
            if not isinstance(stage, dict):
                continue
            for field in ("run", "check", "with", "env"):
                self.check_templates(("stages", i, field), stage.get(field), known)
            if isinstance(stage.get("when"), str):
                self.check_templates(("stages", i, "when"), stage["when"], known, expression=True)

    # stages ------------------------------------------------------------------------------------

    def check_stages(self, stages: list[Any], facts: _InventoryFacts | None) -> None:
        doc = self.doc
        ids: dict[str, int] = {}
        for i, stage in enumerate(stages):
            if not isinstance(stage, dict) or not isinstance(stage.get("id"), str):
                continue
            sid = stage["id"]
            if sid in ids:
                first = doc.loc(("stages", ids[sid], "id")).line
                self.add(doc.loc(("stages", i, "id")), f"duplicate stage id '{sid}'",
                         f"the first stage with this id is on line {first}; ids must be unique")
            else:
                ids[sid] = i
        graph: dict[str, list[str]] = {sid: [] for sid in ids}
        for i, stage in enumerate(stages):
            if not isinstance(stage, dict):
                continue
            sid = stage.get("id") if isinstance(stage.get("id"), str) else None
            for path, need in _names(stage.get("needs"), ("stages", i, "needs")):
                if need in ids:
                    if sid is not None and ids.get(sid) == i:
                        graph[sid].append(need)
                    continue
                close = difflib.get_close_matches(need, list(ids), n=1, cutoff=0.6)
                hint = (f"did you mean '{close[0]}'?" if close
                        else "known stages: " + ", ".join(ids) if ids else None)
                self.add(doc.loc(path), f"{_where(doc, path)}: unknown stage '{need}'", hint)
            self.check_kind(i, stage)
            self.check_shell_quotes(i, stage)
            self.check_templates(("stages", i), {k: stage.get(k) for k in
                                 ("run", "check", "with", "env") if k in stage}, None)
            if isinstance(stage.get("when"), str):
                self.check_templates(("stages", i, "when"), stage["when"], None, expression=True)
            if facts is not None and facts.present:
                known = set(facts.hosts) | set(facts.groups)
                for path, name in _names(stage.get("hosts"), ("stages", i, "hosts")):
                    if name not in known:
                        close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.6)
                        hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
                                else "known hosts and groups: " + ", ".join(sorted(known)))
                        if name == "all":
                            hint = "leave out `hosts:` to run the stage on every host"
                        self.add(doc.loc(path),
                                 f"{_where(doc, path)}: unknown host or group '{name}'", hint)
        self.check_cycles(graph, ids)

    def check_cycles(self, graph: dict[str, list[str]], ids: dict[str, int]) -> None:
        graph = {k: list(v) for k, v in graph.items()}
        for _ in range(20):
            try:
                graphlib.TopologicalSorter(graph).prepare()
                return
            except graphlib.CycleError as exc:
                # each node is needed by the next; reversed, each node needs the next
                cycle = list(reversed(exc.args[1]))
                head = cycle[0]
                pairs = zip(cycle, cycle[1:], strict=False)
                chain = ", ".join(f"'{a}' needs '{b}'" for a, b in pairs)
                if len(cycle) == 2:
                    chain = f"'{head}' needs itself"
                self.add(self.doc.loc(("stages", ids[head], "needs")),
                         f"dependency cycle: {' -> '.join(cycle)} ({chain})",
                         "remove one of these `needs:` so that the stages can run in some order")
                graph[head] = [n for n in graph[head] if n != cycle[1]]

    def check_shell_quotes(self, i: int, stage: dict[str, Any]) -> None:
        """`{{ x }}` written inside shell quotes in a command: its value's own quoting is undone
        (a value holding `'` or `$(...)` would run as shell), so it is refused."""
        paths: list[Path_] = [("stages", i, "run"), ("stages", i, "check")]
        params = stage.get("with")
        if isinstance(stage.get("uses"), str) and isinstance(params, dict):
            kind = stage_kinds().get(stage["uses"])
            for name in sorted(kind.shell_params) if kind is not None else []:
                paths.append(("stages", i, "with", name))
        for path in paths:
            text = self.doc.value_at(path)
            if not isinstance(text, str) or not is_template(text):
                continue
            try:
                inside = quoted_expressions(text)
            except Exception:  # noqa: BLE001 - a template this scan cannot follow: not ours
                continue
            for expr in inside:
                self.add(self.doc.loc(path),
                         f"{_where(self.doc, path)}: {{{{ {expr} }}}} is inside shell quotes; "
                         "the value is quoted already, and inside quotes a value holding a "
                         "quote or $(...) would run as a command",
                         "remove the quotes around it (echo {{ x }}, not "
                         "echo \"{{ x }}\"); `| raw` inserts a value unquoted on purpose")

    def check_kind(self, i: int, stage: dict[str, Any]) -> None:
        kind = stage.get("uses")
        if not isinstance(kind, str) or "run" in stage:
            return
        kinds = stage_kinds()
        path = ("stages", i, "uses")
        if kind not in kinds:
            close = difflib.get_close_matches(kind, sorted(kinds), n=1, cutoff=0.6)
            if close:
                hint = f"did you mean '{close[0]}'?"
            elif kinds:
                hint = "known stage kinds: " + ", ".join(sorted(kinds))
            else:
                hint = "no stage kinds are installed; use `run:` for a shell stage"
            self.add(self.doc.loc(path), f"{_where(self.doc, path)}: unknown stage kind "
                     f"'{kind}'", hint)
            return
        params = stage.get("with", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return  # the StageSpec model reports it
        self.validate(kinds[kind].Params, params, prefix=("stages", i, "with"),
                      skip_templates=True)

    # inventory ---------------------------------------------------------------------------------

    def check_inventory(self, data: dict[str, Any]) -> None:
        doc = self.doc
        hosts = data.get("hosts") if isinstance(data.get("hosts"), dict) else {}
        groups = data.get("groups") if isinstance(data.get("groups"), dict) else {}
        for name in groups:
            if name in hosts:
                self.add(doc.key_loc(("groups", name)),
                         f"'{name}' is the name of both a group and a host",
                         "rename one of them; `hosts:` in a stage could not tell them apart")
        for gname, group in groups.items():
            if not isinstance(group, dict):
                continue
            for path, member in _names(group.get("hosts"), ("groups", gname, "hosts")):
                if member not in hosts:
                    close = difflib.get_close_matches(member, [str(h) for h in hosts], n=1,
                                                      cutoff=0.6)
                    hint = (f"did you mean '{close[0]}'?" if close
                            else "add it under `hosts:` or remove it from the group")
                    self.add(doc.loc(path), f"group '{gname}' lists unknown host '{member}'",
                             hint)
        for hname, host in hosts.items():
            if not isinstance(host, dict) or not isinstance(host.get("hypervisor"), dict):
                continue
            target = host["hypervisor"].get("host")
            path = ("hosts", hname, "hypervisor", "host")
            if isinstance(target, str) and (target not in hosts or target == hname):
                close = difflib.get_close_matches(target, [str(h) for h in hosts if h != hname],
                                                  n=1, cutoff=0.6)
                self.add(doc.loc(path), f"host '{hname}': hypervisor '{target}' is not another "
                         "host of this inventory",
                         f"did you mean '{close[0]}'?" if close
                         else "add the hypervisor under `hosts:`")


# -- helpers ------------------------------------------------------------------------------------


def _translate(
    doc: YamlDoc, err: Any, model: type[BaseModel], prefix: Path_, loc: Path_
) -> tuple[Path_, Location, str, str | None]:
    """A pydantic error as (the path it is about, where, the message, a hint)."""
    etype: str = err["type"]
    got = _got(err.get("input"), doc.secrets)
    if etype in ("missing", "extra_forbidden"):
        return _key_error(doc, etype, model, prefix + loc, loc)
    # Union members add tags to loc that are not in the data: cut back to the real value.
    real_loc = loc
    while real_loc and not doc.has(prefix + real_loc):
        real_loc = real_loc[:-1]
    real = prefix + real_loc
    where = _where(doc, real)
    location = doc.best_loc(real)
    msg: str = err["msg"]
    if real_loc != loc and etype != "value_error":
        expected = _expected(model, real_loc)
        return (real, location, f"{where}: expected {expected}, got {got}", None)
    if etype == "value_error":
        text = msg.removeprefix("Value error, ")
        return (real, location, f"{where}: {text}", None)
    if etype == "literal_error":
        choices = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        close = difflib.get_close_matches(str(err.get("input")), choices, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else None
        return (real, location, f"{where}: expected one of {_choices(choices)}, got {got}",
                hint)
    if etype == "string_pattern_mismatch":
        if real and real[-1] == "id":
            return (real, location,
                    f"{where}: {got} is not a valid stage id",
                    "use letters, digits, '_', '.' and '-' (not starting with '.' or '-')")
        pattern = err.get("ctx", {}).get("pattern")
        return (real, location, f"{where}: {got} does not match the pattern {pattern}", None)
    if etype == "too_short":
        what = "stage" if real == ("stages",) else "host" if real == ("hosts",) else "item"
        return (real, location, f"{where}: must list at least one {what}", None)
    if etype.endswith(("_type", "_parsing")) or etype in ("int_from_float", "model_type"):
        expected = _expected(model, real_loc)
        return (real, location, f"{where}: expected {expected}, got {got}", None)
    if etype in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        text = msg.replace("Input should be", "must be")
        return (real, location, f"{where}: {text}, got {got}", None)
    text = msg.replace("Input should be", "should be")
    return (real, location, f"{where}: {text} (got {got})", None)


def _key_error(doc: YamlDoc, etype: str, model: type[BaseModel], full: Path_,
               loc: Path_) -> tuple[Path_, Location, str, str | None]:
    """A required key missing, or a key the model does not know."""
    parent, name = full[:-1], full[-1]
    if etype == "missing":
        hint = f"add `{name}:`"
        if name == "stages":
            hint = "add `stages:` with a list of stages, each with `id:` and `run:` or `uses:`"
        return (parent, doc.best_loc(parent),
                f"{_where(doc, parent)}: missing required key '{name}'", hint)
    allowed = _field_names(_annotation_at(model, loc[:-1]))
    close = difflib.get_close_matches(str(name), allowed, n=2, cutoff=0.6)
    hint = (f"did you mean '{close[0]}'?" if close
            else ("allowed keys: " + ", ".join(allowed)) if allowed else None)
    return (full, doc.key_loc(full), f"{_where(doc, parent)}: unknown key '{name}'", hint)


def _names(value: Any, path: Path_) -> list[tuple[Path_, str]]:
    """(path, name) of a field holding one name or a list of names (others are skipped)."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, list):
        return [((*path, j), v) for j, v in enumerate(value) if isinstance(v, str)]
    return []


def _templated(data: Any, loc: Path_) -> bool:
    """True when the value at `loc` (or any value above it) is a template string; for an error
    about the whole object (empty loc), when any value inside holds a template."""
    if not loc:
        return _holds_template(data)
    value = data
    for part in loc:
        if is_template(value):
            return True
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            value = value[part]
        else:
            return False
    return is_template(value)


def _at(data: Any, loc: Path_) -> Any:
    """The value at `loc` inside `data` (None when there is none)."""
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def _holds_template(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_template(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_template(v) for v in value)
    return is_template(value)


def _where(doc: YamlDoc, path: Path_) -> str:
    """A path in words: "stage 'build', needs[1]", "host 'gpu1', port", "top level"."""
    data = doc.data
    head = ""
    rest = path
    if len(path) >= 2 and path[0] == "stages" and isinstance(path[1], int):
        stage = None
        stages = data.get("stages") if isinstance(data, dict) else None
        if isinstance(stages, list) and 0 <= path[1] < len(stages):
            stage = stages[path[1]]
        sid = stage.get("id") if isinstance(stage, dict) else None
        head = f"stage '{sid}'" if isinstance(sid, str) else f"stage #{path[1] + 1}"
        rest = path[2:]
    elif len(path) >= 2 and path[0] in ("hosts", "groups"):
        head = f"{'host' if path[0] == 'hosts' else 'group'} '{path[1]}'"
        rest = path[2:]
    dotted = ""
    for part in rest:
        dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else str(part))
    if head and dotted:
        return f"{head}, {dotted}"
    return head or dotted or "top level"


def _got(value: Any, secrets: set[str] | frozenset[str] = frozenset()) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        if value in secrets:
            return "'***'"
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _choices(choices: list[str]) -> str:
    quoted = [f"'{c}'" for c in choices]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _unwrap(annotation: Any) -> Any:
    """Drop None from Optional[X]."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """YAML key -> annotation (aliases where set)."""
    return {(f.alias or name): f.annotation for name, f in model.model_fields.items()}


def _field_names(annotation: Any) -> list[str]:
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(_fields(annotation))
    return []


def _annotation_at(model: type[BaseModel], loc: Path_) -> Any:
    """The annotation of the value at `loc` under `model`, or None when it cannot be followed."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        origin = get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = _fields(annotation).get(part)
        elif origin is list and isinstance(part, int):
            annotation = get_args(annotation)[0] if get_args(annotation) else Any
        elif origin is dict:
            args = get_args(annotation)
            annotation = args[1] if len(args) == 2 else Any
        else:
            return None
        if annotation is None:
            return None
    return annotation


def _expected(model: type[BaseModel], loc: Path_) -> str:
    """What the value at `loc` should be, in words."""
    if loc and isinstance(loc[-1], str):
        owner = _unwrap(_annotation_at(model, loc[:-1]))
        if isinstance(owner, type) and issubclass(owner, BaseModel):
            special = _EXPECT.get((owner.__name__, loc[-1]))
            if special:
                return special
            if loc[-1] == "vars":
                return _VARS_EXPECT
    return _describe(_annotation_at(model, loc))


def _describe(annotation: Any) -> str:
    annotation = _unwrap(annotation)
    origin = get_origin(annotation)
    if annotation is None or annotation is Any:
        return "a value"
    if origin is Literal:
        choices = _choices([str(a) for a in get_args(annotation)])
        return choices if len(get_args(annotation)) == 1 else "one of " + choices
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(annotation) if a is not type(None))
    if origin is list:
        args = get_args(annotation)
        return "a list" + (f" of {_plural(args[0])}" if args else "")
    if origin is dict or annotation is dict:
        return "a mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        names = list(_fields(annotation))
        return f"a mapping ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})"
    return {str: "text", int: "a whole number", float: "a number", bool: "true or false"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def _plural(annotation: Any) -> str:
    text = _describe(annotation)
    return {"text": "texts", "a whole number": "whole numbers", "a number": "numbers",
            "true or false": "booleans"}.get(text, text.removeprefix("a ").removeprefix("an "))


def _attach(root: BaseModel, doc: YamlDoc, base: Path_) -> None:
    """Give every model object its `_location` and the locations of the values inside it."""
    objects: dict[Path_, BaseModel] = {}

    def walk(obj: Any, path: Path_) -> None:
        if isinstance(obj, BaseModel):
            objects[path] = obj
            for name, field in type(obj).model_fields.items():
                walk(getattr(obj, name), (*path, field.alias or name))
        elif isinstance(obj, list):
            for i, item in enumerate(obj):
                walk(item, (*path, i))
        elif isinstance(obj, dict):
            for key, item in obj.items():
                if isinstance(item, (BaseModel, list, dict)):
                    walk(item, (*path, key))

    walk(root, base)
    for path, obj in objects.items():
        obj._location = doc.best_loc(path)
        obj._field_locations = {}
    for path in doc.locations:
        loc = doc.best_loc(path)  # a mapping or list written under a key: the key's line
        for k in range(len(path)):
            owner = objects.get(path[:k])
            if owner is not None:
                owner._field_locations[path[k:]] = loc


__all__ = ["load_all", "load_inventory", "load_playbook", "validate_params"]
