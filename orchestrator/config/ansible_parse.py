"""How ansible-core reads an inventory file: hosts, groups and their inline variables.

`IniReader` and `YamlReader` build an `Inventory` as ansible-core 2.19.0's InventoryData holds it
(cited as `file:line` under `lib/ansible/`), every value with the place it was written and every
problem collected (located) instead of stopping at the first. `config.ansible` adds group_vars/
and host_vars/, resolves each host's variables and translates the result into our format.
"""

from __future__ import annotations

import ast
import io
import ipaddress
import os
import re
import shlex
import string
import warnings
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.templating import Data
from orchestrator.config.yamlsrc import MAX_NODES, YamlDoc
from orchestrator.errors import ConfigProblem, Location

Path_ = tuple[Any, ...]
GROUP_KEYS = ("vars", "children", "hosts")  # plugins/inventory/yaml.py:136, 154-167
#: the most hosts an inventory may name (host ranges expand), as our YAML's value limit
MAX_HOSTS = MAX_NODES


# -- the inventory as Ansible holds it --------------------------------------------------------


@dataclass
class Val:
    """A variable's value and where it was written: the value, its name, the values inside it."""

    value: Any
    loc: Location
    key_loc: Location
    inner: dict[Path_, Location] = field(default_factory=dict)


@dataclass(eq=False)
class Group:
    """A group (inventory/group.py:68-85): its inline vars, children, parents and own hosts."""

    name: str
    loc: Location
    vars: dict[str, Val] = field(default_factory=dict)
    children: list[Group] = field(default_factory=list)
    parents: list[Group] = field(default_factory=list)
    #: the group's own hosts in the order added (a dict as an ordered set: a name is looked up,
    #: added and removed in constant time, so reading n hosts stays linear in n)
    hosts: dict[str, None] = field(default_factory=dict)
    priority: int = 1


@dataclass(eq=False)
class Host:
    """A host (inventory/host.py:59-75): its inline vars and the groups that list it."""

    name: str
    loc: Location
    vars: dict[str, Val] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)


class Inventory:
    """Hosts and groups as InventoryData builds them (inventory/data.py), problems collected."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.groups: dict[str, Group] = {}
        self.hosts: dict[str, Host] = {}
        self.problems: list[ConfigProblem] = []
        self.secrets: set[str] = set()
        #: what only Ansible reads, found on the way (vault, an inventory plugin's configuration)
        self.needs_ansible: list[str] = []
        where = os.path.abspath(source)  # inventory/data.py:197-199
        self.file, self.dir = Data(where), Data(os.path.dirname(where))
        top = Location(source, 1, 1)
        for name in ("all", "ungrouped"):  # inventory/data.py:58-61
            self.add_group(name, top)
        self.add_child("all", "ungrouped", top)

    def problem(self, loc: Location | None, message: str, hint: str | None = None) -> None:
        self.problems.append(ConfigProblem(loc, message, hint))

    def add_group(self, name: str, loc: Location) -> Group:
        if name not in self.groups:
            self.groups[name] = Group(name, loc)
        return self.groups[name]

    def add_host(self, name: str, group: str, port: int | None, loc: Location) -> Host | None:
        """inventory/data.py:177-222: a host is made once (a port in its pattern counts only then,
        inventory/host.py:69-70), then joins the group."""
        host = self.hosts.get(name)
        if host is None:
            if len(self.hosts) >= MAX_HOSTS:
                self.problem(loc, f"the inventory names more than {MAX_HOSTS} hosts",
                             "check the host ranges ([01:16]) written here")
                return None
            host = self.hosts[name] = Host(name, loc)
            host.vars["inventory_file"] = Val(self.file, loc, loc)  # inventory/data.py:197-199
            host.vars["inventory_dir"] = Val(self.dir, loc, loc)
            if port is not None:
                host.vars["ansible_port"] = Val(port, loc, loc)
        owner = self.groups[group]
        if name not in owner.hosts:
            owner.hosts[name] = None
            host.groups.append(group)
        return host

    def add_child(self, parent: str, child: str, loc: Location) -> None:
        """inventory/group.py:147-180, its two errors located where the edge was written."""
        p, c = self.groups[parent], self.groups[child]
        if p is c:  # inventory/group.py:149-150
            self.problem(loc, f"group '{child}' is listed as its own child",
                         f"remove '{child}' from the children of '{parent}'")
            return
        if p in c.parents:  # (a group's parents are few; `all` may have many children)
            return
        if c in self.ancestors(p):  # inventory/group.py:155-159
            self.problem(loc, f"adding group '{child}' as a child of '{parent}' makes a loop "
                         f"('{parent}' is already inside '{child}')",
                         "groups may not contain themselves, directly or through children")
            return
        p.children.append(c)
        c.parents.append(p)

    def set_var(self, owner: Group | Host, key: str, val: Val) -> None:
        """inventory/group.py:221-235, inventory/host.py:119-130: a later value replaces an
        earlier one; `ansible_group_priority` on a group sets its priority instead."""
        if isinstance(owner, Group) and key == "ansible_group_priority":
            try:
                owner.priority = int(val.value)
            except (TypeError, ValueError):
                self.problem(val.loc, f"group '{owner.name}': ansible_group_priority must be a "
                             f"whole number, got {val.value!r}", "e.g. ansible_group_priority=10")
            return
        owner.vars[key] = val

    def ancestors(self, group: Group) -> list[Group]:
        seen: dict[str, Group] = {}
        todo = list(group.parents)
        while todo:
            g = todo.pop()
            if g.name not in seen:
                seen[g.name] = g
                todo.extend(g.parents)
        return list(seen.values())

    def reconcile(self) -> None:
        """inventory/data.py:94-124: orphan groups go under `all`; `ungrouped` holds exactly the
        hosts of no other group."""
        for group in list(self.groups.values()):
            if group.name != "all" and not group.parents:
                self.add_child("all", group.name, group.loc)
        ungrouped = self.groups["ungrouped"]
        for host in self.hosts.values():
            names = {g.name for g in self.groups_of(host)}
            if "ungrouped" in names:
                if names - {"all", "ungrouped"}:
                    del ungrouped.hosts[host.name]
                    host.groups.remove("ungrouped")
            elif not names - {"all"}:
                ungrouped.hosts[host.name] = None
                host.groups.append("ungrouped")

    def groups_of(self, host: Host) -> list[Group]:
        """The host's groups and their ancestors (inventory/host.py:90-101)."""
        out: dict[str, Group] = {}
        for name in host.groups:
            for g in [self.groups[name], *self.ancestors(self.groups[name])]:
                out.setdefault(g.name, g)
        return list(out.values())

    def depths(self) -> dict[str, int]:
        """A group's depth: the longest path from `all` (inventory/group.py:166-199)."""
        memo: dict[str, int] = {}

        def depth(g: Group) -> int:
            if g.name not in memo:
                memo[g.name] = max((depth(p) + 1 for p in g.parents), default=0)
            return memo[g.name]

        for g in self.groups.values():
            depth(g)
        return memo

    def members(self, group: Group) -> list[str]:
        """Hosts of a group and of its descendants (inventory/group.py:249-261)."""
        order = {group.name: group}
        todo = [group]
        for g in todo:  # breadth first, as written
            for c in g.children:
                if c.name not in order:
                    order[c.name] = c
                    todo.append(c)
        return list(dict.fromkeys(h for g in todo for h in g.hosts))


# -- INI ------------------------------------------------------------------------------------------

# plugins/inventory/ini.py:406-415 and :422-429
_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")


@dataclass
class _Pending:
    """A group named before it is declared (plugins/inventory/ini.py:168, 196-204, 243-246)."""

    loc: Location
    state: str
    parents: list[str] = field(default_factory=list)


class IniReader:
    """An INI inventory, as plugins/inventory/ini.py:155-261 reads it.

    Lines are stripped; empty lines and lines starting with `#` or `;` are skipped (:174-177).
    `[name]`, `[name:vars]`, `[name:children]` start sections (:182-215); other `:type`s are
    errors (:188-191); the name is kept as written (:81, :186: inventory/group.py:39-60 replaces
    no character with TRANSFORM_INVALID_GROUP_CHARS at its default, config/base.yml:1694-1696,
    only warns). Before any section,
    hosts go to `ungrouped` (:163-170). A host line is split like a shell line with `#` comments
    (:315-318): a host pattern (`name`, `name:port`, ranges `gpu[01:16]`) then `key=value` items
    (:320-328); a `:vars` line is `key=value`, the value being the rest of the line (:293-295).
    Every value goes through ast.literal_eval, kept as text when that fails (:370-389), tuples and
    sets become lists (:350-368). A `:vars` or `:children` section may name a group declared later;
    one never declared is an error (:253-261).
    """

    def __init__(self, source: str, text: str) -> None:
        self.inv = Inventory(source)
        self.source = source
        self.lines = text.splitlines()
        self.pending: dict[str, _Pending] = {}

    def read(self) -> Inventory:
        group, state = "ungrouped", "hosts"
        for number, raw in enumerate(self.lines, 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            indent = len(raw) - len(raw.lstrip())
            loc = Location(self.source, number, indent + 1)
            m = _SECTION.match(line)
            if m:
                group, state = self.section(m, loc)
            elif line.startswith("[") and line.endswith("]"):  # plugins/inventory/ini.py:216-218
                self.inv.problem(loc, f"invalid section header {line!r}",
                                 "write [group], [group:vars] or [group:children], without "
                                 "spaces or other characters inside the brackets")
                state = "skip"
            elif state == "hosts":
                self.host_line(group, line, number, indent)
            elif state == "vars":
                self.var_line(group, line, number, indent)
            elif state == "children":
                self.child_line(group, line, loc)
        self.unresolved()
        self.inv.reconcile()
        return self.inv

    def section(self, m: re.Match[str], loc: Location) -> tuple[str, str]:
        name, state = m.group(1), m.group(2) or "hosts"
        if state not in ("hosts", "children", "vars"):
            at = Location(loc.file, loc.line, loc.column + m.start(2))
            self.inv.problem(at, f"section [{m.group(1)}:{state}] has unknown type '{state}'",
                             f"a section is [{name}] (hosts), [{name}:vars] or "
                             f"[{name}:children]")
            return name, "skip"
        if name not in self.inv.groups:
            if state == "vars" and name not in self.pending:
                self.pending[name] = _Pending(loc, "vars")
            self.inv.add_group(name, loc)
        decl = self.pending.get(name)
        if decl is not None and state != "vars":
            if decl.state == "children":
                self.add_pending_children(name)
            else:
                del self.pending[name]
        return name, state

    def add_pending_children(self, group: str) -> None:
        """plugins/inventory/ini.py:263-268 (the declaration is taken first: no endless loop)."""
        decl = self.pending.pop(group)
        for parent in decl.parents:
            self.inv.add_child(parent, group, decl.loc)
            if parent in self.pending and self.pending[parent].state == "children":
                self.add_pending_children(parent)

    def unresolved(self) -> None:
        for name, decl in self.pending.items():
            if decl.state == "vars":
                self.inv.problem(decl.loc, f"section [{name}:vars] is for group '{name}', which "
                                 "is never declared",
                                 f"declare the group with a [{name}] or [{name}:children] "
                                 "section, or remove these vars")
            else:
                self.inv.problem(decl.loc, f"[{decl.parents[-1]}:children] lists group "
                                 f"'{name}', which is never declared",
                                 f"add a [{name}] section with its hosts, or remove this line")

    def child_line(self, group: str, line: str, loc: Location) -> None:
        """plugins/inventory/ini.py:240-248, 270-280."""
        m = _GROUP_NAME.match(line)
        if not m:
            self.inv.problem(loc, f"[{group}:children]: expected a group name, got {line!r}",
                             "one group name per line (no spaces, ':' or ']')")
            return
        child = m.group(1)
        if child in self.inv.groups:
            self.inv.add_child(group, child, loc)
        elif child in self.pending:
            self.pending[child].parents.append(group)
        else:
            self.pending[child] = _Pending(loc, "children", [group])

    def var_line(self, group: str, line: str, number: int, indent: int) -> None:
        """plugins/inventory/ini.py:282-297: `key=value`, the value being the rest of the line."""
        if "=" not in line:
            self.inv.problem(Location(self.source, number, indent + 1),
                             f"[{group}:vars]: expected key=value, got {line!r}",
                             "one variable per line, e.g. http_port=8080")
            return
        key, rest = line.split("=", 1)
        value_col = indent + len(key) + 1 + (len(rest) - len(rest.lstrip())) + 1
        val = Val(_ini_value(rest.strip()), Location(self.source, number, value_col),
                   Location(self.source, number, indent + 1))
        self.inv.set_var(self.inv.groups[group], key.strip(), val)

    def host_line(self, group: str, line: str, number: int, indent: int) -> None:
        """plugins/inventory/ini.py:226-228, 299-348; plugins/inventory/__init__.py:225-232."""
        loc = Location(self.source, number, indent + 1)
        try:
            tokens = _tokens(line)
        except ValueError as exc:  # plugins/inventory/ini.py:315-318
            self.inv.problem(loc, f"cannot read this host line: {exc}",
                             "close the quote, or quote the value differently")
            return
        if not tokens:
            return
        pattern, col = tokens[0]
        at = Location(self.source, number, indent + col + 1)
        try:
            names, port = expand_host_pattern(pattern, ini=True)
        except ValueError as exc:
            self.inv.problem(at, f"host pattern {pattern!r}: {exc}", PATTERN_HINT)
            return
        variables: dict[str, Val] = {}
        for text, tcol in tokens[1:]:
            where = Location(self.source, number, indent + tcol + 1)
            if "=" not in text:  # plugins/inventory/ini.py:324-326
                self.inv.problem(where, f"host '{pattern}': expected key=value, got {text!r}",
                                 "a host line is NAME key=value ...; quote a value that holds "
                                 "spaces: key=\"a b\"")
                continue
            key, value = text.split("=", 1)
            value_at = Location(self.source, number, where.column + len(key) + 1)
            variables[key] = Val(_ini_value(value), value_at, where)
        for name in names:
            host = self.inv.add_host(name, group, port, at)
            if host is None:
                return
            for key, val in variables.items():
                self.inv.set_var(host, key, val)


PATTERN_HINT = ("a host is NAME, NAME:PORT or a range such as gpu[01:16] or gpu-[a:f] "
                 "(begin:end or begin:end:step)")


#: what shlex treats specially in posix mode with whitespace_split (CPython 3.11 Lib/shlex.py:
#: commenters :36, quotes :44, escape :45, whitespace :42); a line without them, or other
#: whitespace (which the columns below skip), is split at those four whitespace characters alone,
#: which is what shlex does with it, only faster
_SHLEX_SPECIAL = re.compile(r"[#'\"\\]|[^\S \t\r\n]")
_SHLEX_WORD = re.compile(r"[^ \t\r\n]+")


def _tokens(line: str) -> list[tuple[str, int]]:
    """shlex.split(line, comments=True) (utils/shlex.py:24, plugins/inventory/ini.py:316), with
    the column (0-based) at which each token starts."""
    if not _SHLEX_SPECIAL.search(line):
        return [(m.group(), m.start()) for m in _SHLEX_WORD.finditer(line)]
    stream = io.StringIO(line)
    lex = shlex.shlex(stream, posix=True)
    lex.whitespace_split = True
    out: list[tuple[str, int]] = []
    while True:
        before = stream.tell()
        token = lex.get_token()
        if token is None:
            return out
        rest = line[before:]
        out.append((token, before + len(rest) - len(rest.lstrip())))


#: text that ast.literal_eval refuses for sure, kept as text without trying: a name or dotted
#: name (ast.Name, ast.Attribute: "malformed node") other than True/False/None, and dotted
#: numbers such as an IPv4 address (a SyntaxError); a decimal whole number is that number
_NOT_LITERAL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*|[0-9]+(?:\.[0-9]+){2,}",
                          re.ASCII)
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)


def _ini_value(text: str) -> Any:
    """plugins/inventory/ini.py:370-389 and 350-368: a Python literal when it is one, else text."""
    if _NOT_LITERAL.fullmatch(text) and text not in ("True", "False", "None"):
        return text
    if _DECIMAL.fullmatch(text):
        return int(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _coerce(value)


def _coerce(value: Any) -> Any:
    if isinstance(value, (list, tuple, set)):
        return [_coerce(v) for v in value]
    if isinstance(value, dict):
        return {k: _coerce(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return value


# -- host patterns --------------------------------------------------------------------------------

# parsing/utils/addresses.py:85-91 and :96-106
_BRACKETED_PORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"  # parsing/utils/addresses.py:40-48
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"  # parsing/utils/addresses.py:75-79
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.I)  # parsing/utils/addresses.py:157-163


def expand_host_pattern(pattern: str, *, ini: bool = False) -> tuple[list[str], int | None]:
    """Host names and port of a pattern such as `gpu[01:04].lab:2222`
    (plugins/inventory/__init__.py:277-300; INI's extra checks: plugins/inventory/ini.py:332-348).
    Raises ValueError with what is wrong."""
    host, port = _split_port(pattern)
    names = _expand_ranges(host, [0]) if "[" in host else [host]
    if ini and pattern.strip().endswith(":") and port is None:
        raise ValueError("ends in ':', which is reserved for a port")
    if ini and any(n.strip() == "---" for n in names):
        raise ValueError("'---' is the start of a YAML document; is this a YAML file?")
    if any(not n for n in names):  # inventory/data.py:219-220
        raise ValueError("an empty host name")
    return names, port


def _split_port(address: str) -> tuple[str, int | None]:
    """parsing/utils/addresses.py:168-214; what is not a host[:port] is a name, without a port
    (plugins/inventory/__init__.py:285-290)."""
    host, port = address, None
    for pattern in (_BRACKETED_PORT, _HOST_PORT):
        m = pattern.match(host)
        if m:
            host, port = m.group(1), int(m.group(2))
    if _HOSTNAME.match(host):
        return host, port
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return address, None
    return host, port


def _expand_ranges(line: str, count: list[int]) -> list[str]:
    """plugins/inventory/__init__.py:63-132: `db[01:10:3]-[a:c]` -> db01-a, db01-b, ..."""
    parts = line.replace("[", "|", 1).replace("]", "|", 1).split("|")
    if len(parts) != 3:
        raise ValueError("a host range is written [begin:end] or [begin:end:step]")
    head, nrange, tail = parts
    bounds = nrange.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError("host range must be begin:end or begin:end:step")
    beg, end = bounds[0] or "0", bounds[1]
    step = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise ValueError("host range must specify end value")
    width = len(beg) if beg[0] == "0" and len(beg) > 1 else 0
    if width and width != len(end):
        raise ValueError("host range must specify equal-length begin and end formats")
    seq: list[str] | range
    try:
        i_beg, i_end = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if i_beg > i_end:
            raise ValueError("host range must have begin <= end")
        seq = list(string.ascii_letters[i_beg:i_end + 1:int(step)])
    except ValueError as exc:
        if "begin <= end" in str(exc):
            raise
        try:
            seq = range(int(beg), int(end) + 1, int(step))
        except ValueError:
            raise ValueError(f"[{nrange}] is not a range of numbers or letters") from None
    count[0] += len(seq)
    if count[0] > MAX_HOSTS:
        raise ValueError(f"expands to more than {MAX_HOSTS} hosts")
    out: list[str] = []
    for item in seq:
        name = head + (str(item).zfill(width) if width else str(item)) + tail
        out.extend(_expand_ranges(name, count) if "[" in name else [name])
    return out


# -- YAML -----------------------------------------------------------------------------------------


class YamlReader:
    """A YAML inventory, as plugins/inventory/yaml.py:99-184 reads it.

    The top level maps group names to groups (:117-121); `plugin:` there marks an inventory
    plugin's configuration, not an inventory (:114-115). A group is a mapping or empty (:127);
    its `vars`, `children` and `hosts` are mappings, a single name standing for `{name: }`
    (:136-144), taken in the order written (:146-165): vars set the group's variables, children
    are groups (read the same way) made children of this one, hosts map host patterns to their
    variables or nothing (:162-165, plugins/inventory/__init__.py:225-232).
    """

    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.index = Inner(doc)
        self.inv = Inventory(doc.source)
        self.inv.secrets |= doc.secrets

    def read(self) -> Inventory:
        data = self.doc.data
        if "plugin" in data:
            self.inv.needs_ansible.append("an inventory plugin")
            self.inv.problem(self.doc.key_loc(("plugin",)),
                             f"this is the configuration of the inventory plugin "
                             f"{data['plugin']!r}, not an inventory",
                             "install ansible-core (orchestrator then runs ansible-inventory "
                             "on it), or export a static one with "
                             "`ansible-inventory -i THIS --list --yaml`")
            return self.inv
        for name, group in data.items():
            self.group(str(name), group, (name,))
        self.inv.reconcile()
        return self.inv

    def group(self, name: str, data: Any, path: Path_) -> str | None:
        doc = self.doc
        if data is not None and not isinstance(data, dict):  # plugins/inventory/yaml.py:169-170
            self.inv.problem(doc.loc(path), f"group '{name}': expected a mapping with hosts, "
                             f"children or vars, got {kind_of(data)}",
                             "write the group as `NAME: {hosts: {...}}` (Ansible would skip it)")
            return None
        group = self.inv.add_group(name, doc.key_loc(path))
        for key, value in (data or {}).items():
            at = (*path, key)
            if key not in GROUP_KEYS:  # plugins/inventory/yaml.py:166-167
                self.inv.problem(doc.key_loc(at), f"group '{name}': unknown key '{key}'",
                                 "a group holds only hosts, children and vars (Ansible would "
                                 "skip this key)")
                continue
            if isinstance(value, str):
                value = {value: None}
            if value is None:
                continue
            if not isinstance(value, dict):  # plugins/inventory/yaml.py:142-144
                self.inv.problem(doc.loc(at), f"group '{name}', {key}: expected a mapping, got "
                                 f"{kind_of(value)}", f"write `{key}:` as NAME: VALUE lines")
                continue
            for item, sub in value.items():
                self.entry(group, key, str(item), sub, (*at, item))
        return group.name

    def entry(self, group: Group, key: str, item: str, data: Any, path: Path_) -> None:
        if key == "vars":
            self.inv.set_var(group, item, val_at(self.doc, path, self.index))
        elif key == "children":
            child = self.group(item, data, path)
            if child is not None:
                self.inv.add_child(group.name, child, self.doc.key_loc(path))
        else:
            self.host(group, item, data, path)

    def host(self, group: Group, pattern: str, data: Any, path: Path_) -> None:
        at = self.doc.key_loc(path)
        try:
            names, port = expand_host_pattern(pattern)
        except ValueError as exc:
            self.inv.problem(at, f"host pattern {pattern!r}: {exc}", PATTERN_HINT)
            return
        data = data or {}
        if not isinstance(data, dict):  # plugins/inventory/__init__.py:226-227
            self.inv.problem(self.doc.loc(path), f"host '{pattern}': expected a mapping of "
                             f"variables, got {kind_of(data)}",
                             "write `NAME:` alone, or `NAME: {ansible_host: ...}`")
            data = {}
        for name in names:
            host = self.inv.add_host(name, group.name, port, at)
            if host is None:
                return
            for key in data:
                self.inv.set_var(host, str(key), val_at(self.doc, (*path, key), self.index))


class Inner:
    """The locations of a document's values by the path of the value holding them, built once,
    so that finding the locations inside one value costs the size of that value (not of the
    whole document: reading n hosts with their variables stays linear in n)."""

    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.children: dict[Path_, list[Path_]] = {}
        for path in doc.locations:
            if path:
                self.children.setdefault(path[:-1], []).append(path)

    def under(self, path: Path_) -> dict[Path_, Location]:
        n, out, todo = len(path), {}, list(self.children.get(path, ()))
        while todo:
            p = todo.pop()
            out[p[n:]] = self.doc.locations[p]
            todo.extend(self.children.get(p, ()))
        return out


def val_at(doc: YamlDoc, path: Path_, index: Inner | None = None) -> Val:
    """The value at `path` with its locations (give `index` when reading many values of one
    document)."""
    inner = (index or Inner(doc)).under(path)
    return Val(doc.value_at(path), doc.loc(path), doc.key_loc(path), inner)


def kind_of(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{value!r}"
