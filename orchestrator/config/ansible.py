"""Ansible inventories as they are: INI and YAML files, with group_vars/ and host_vars/ beside them.

`read_inventory(path)` is what `-i` reads. Our own inventory format comes back as loaded; an
Ansible inventory is read the way ansible-core reads it and handed back as the data of our format
(hosts with their connection settings and variables, groups with their hosts), every value keeping
the place it was written (INI line and column, YAML value, group_vars file), so that the loader's
checks and messages are the same for both formats.

Each rule below cites ansible-core 2.19.0 as `file:line` under `lib/ansible/`:

- Which reader (`_kind`): `.yaml`, `.yml`, `.json` and no extension are YAML
  (plugins/inventory/yaml.py:90-97), `.toml` is TOML (plugins/inventory/ini.py:108-110), anything
  else INI; YAML is tried before INI (config/base.yml:1732-1734), so a file without extension
  that is not a YAML mapping is INI. A YAML mapping is Ansible's (its keys are groups:
  plugins/inventory/yaml.py:117-121) when it has `all:` or `plugin:`, or none of our format's
  top-level keys (hosts, groups, vars, defaults, secrets); else it is our own format.
- INI and YAML files: `config.ansible_parse` (IniReader, YamlReader: see their docstrings).
- Groups (`Inventory.reconcile`): a group without a parent is a child of `all`; a host in no
  group is in `ungrouped`, and leaves it once in another group (inventory/data.py:94-124).
- Variables of a host, lowest first (vars/manager.py:224-286 with the default
  VARIABLE_PRECEDENCE, config/base.yml:2162-2164): `all`'s inventory vars; the inventory vars of
  the host's other groups (with their ancestors, inventory/host.py:90-101), sorted by depth, then
  `ansible_group_priority`, then name (inventory/helpers.py:25-40); group_vars/all;
  group_vars/<group> in the same order; the host's inventory vars; host_vars/<host>. A value
  replaces the one below it whole (utils/vars.py:80-91, hash_behaviour=replace).
- group_vars/<name> and host_vars/<name> sit in the inventory file's directory
  (plugins/vars/host_group_vars.py:86-90, utils/path.py:93-108): the first of <name>,
  <name>.yml, <name>.yaml, <name>.json that exists; a directory is read whole, in sorted order,
  recursively, skipping hidden and `~` files and files of other extensions
  (parsing/dataloader.py:475-523); empty files add nothing (plugins/vars/host_group_vars.py:73-78).
  They are YAML 1.1 (yes/no/on/off are booleans: _internal/_yaml/_loader.py:54-66).
- Connection settings (`_connection`) come from the host's variables as the ssh connection
  plugin reads them (plugins/connection/ssh.py; of two names the later one wins,
  config/manager.py:517-537); every variable, `ansible_*` ones included, stays a variable.
  The ssh options in ansible_ssh_args, _common_args and _extra_args are read as ssh reads them
  (`config.openssh`, OpenSSH 10.0p1 cited there).

On purpose, unlike Ansible: a YAML group key other than hosts/children/vars, or a group that is
not a mapping, is an error (Ansible warns and skips it); host-key checking cannot be turned off
or made useless (`ansible_host_key_checking: false`, StrictHostKeyChecking no/off/false,
UserKnownHostsFile /dev/null or none, NoHostAuthenticationForLocalhost yes, however written);
become is sudo to root for the stages that ask for it, so `ansible_become` and a become method,
user, program or flags other than that are refused (`_become`); password logins are refused.
Inventory directories, vault, inventory plugins and scripts and TOML are read by running
`ansible-inventory` when Ansible is installed (`config.ansible_cli`, which also says when), and
refused with a located error otherwise. Every error found is reported, not only the first;
then the loader checks the result as it checks our format
(a variable name such as `my-var`, which templates cannot use, or a group and a host of one name,
are errors; Ansible only warns). Our own settings that Ansible has no variable for (e.g.
`hypervisor`, `wait_for_host`) are written as `orchestrator_<setting>` variables.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shlex
from collections.abc import Iterator
from typing import Any

from orchestrator.config import ansible_cli, openssh
from orchestrator.config.ansible_parse import (
    Host,
    IniReader,
    Inner,
    Inventory,
    Val,
    YamlReader,
    kind_of,
    val_at,
)
from orchestrator.config.templating import Data, is_template
from orchestrator.config.yamlsrc import YamlDoc, load_yaml, read_text
from orchestrator.errors import ConfigError, ConfigProblem, Location

Path_ = tuple[Any, ...]
_YAML_EXTENSIONS = (".yaml", ".yml", ".json")  # plugins/inventory/yaml.py:20-24
_OUR_KEYS = frozenset({"hosts", "groups", "defaults", "secrets", "vars"})


def read_inventory(
    path: str | os.PathLike[str], *, environ: Any = None
) -> tuple[YamlDoc | None, list[ConfigProblem]]:
    """The inventory at `path` as our format's data (an Ansible one translated), and the problems
    found in the Ansible inventory (located; the data holds what could be read, None when no
    host could be). ConfigError when the file cannot be read at all."""
    with _no_cycle_collection():
        return _read_inventory(str(path), environ)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Reading builds a few objects per host and value, none in a reference cycle but a group's
    parents and children; the cycle collector's full passes over that growing heap cost more
    than the reading itself (2.3 s of 3.8 s for 100,000 INI hosts), so it waits until the end
    (it was on: it is on again; whatever it would have found is found then)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _read_inventory(source: str, environ: Any) -> tuple[YamlDoc | None, list[ConfigProblem]]:
    how = ansible_cli.mode(environ)
    tool = None if how == "never" else ansible_cli.find_tool()
    reason = _only_ansible_reads(source)
    if reason is not None:
        if tool is not None:
            return _with_ansible(tool, source, environ)
        raise ConfigError([ConfigProblem(
            None if os.path.isdir(source) else Location(source, 1, 1),
            f"{source}: {reason}, which only Ansible reads", _INSTALL_ANSIBLE)])
    try:
        read = _builtin(source, environ)
    except ConfigError as exc:
        if tool is not None and any(p.message == "unsupported tag '!vault'"
                                    for p in exc.problems):
            return _with_ansible(tool, source, environ)
        raise
    if isinstance(read, YamlDoc):
        return read, []
    doc, problems = _translate(read, environ)
    if tool is not None and (how == "always" or read.needs_ansible):
        return _with_ansible(tool, source, environ)
    return doc, problems


_INSTALL_ANSIBLE = ("install ansible-core (pip install ansible-core): orchestrator then reads it "
                    "with ansible-inventory; or give a static INI or YAML inventory file")


def _only_ansible_reads(source: str) -> str | None:
    """What the built-in reader cannot read at all: an inventory directory, TOML, a vault-
    encrypted file, an inventory script (executable: plugins/inventory/script.py:185-186)."""
    if os.path.isdir(source):
        return "is a directory (an Ansible inventory directory)"
    if _kind(source) == "toml":
        return "a TOML inventory"
    try:
        with open(source, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return None  # read_text says why
    if head.startswith(b"$ANSIBLE_VAULT"):
        return "a vault-encrypted inventory"
    if head.startswith(b"#!") and os.access(source, os.X_OK):
        return "an inventory script"
    return None


def _with_ansible(tool: str, source: str, environ: Any) -> tuple[YamlDoc | None,
                                                                 list[ConfigProblem]]:
    """SOURCE read by ansible-inventory; group_vars/ and host_vars/ are in its answer."""
    return _translate(ansible_cli.read_with_ansible(tool, source), environ, vars_files=False)


def _builtin(source: str, environ: Any) -> Inventory | YamlDoc:
    """The built-in reader: an Ansible inventory file, or (a YamlDoc) our own format."""
    kind = _kind(source)
    if kind == "ini":
        return IniReader(source, read_text(source)).read()
    try:
        doc = load_yaml(source, environ=environ)
    except ConfigError:
        if kind == "yaml":
            raise
        return IniReader(source, read_text(source)).read()
    if kind is None and not isinstance(doc.data, dict):
        return IniReader(source, read_text(source)).read()
    if not is_ansible_yaml(doc.data):
        return doc
    doc = load_yaml(source, environ=environ, yaml11_booleans=True)
    return YamlReader(doc).read()


def _kind(source: str) -> str | None:
    ext = os.path.splitext(source)[1].lower()
    if ext == ".toml":
        return "toml"
    if ext in _YAML_EXTENSIONS:
        return "yaml"
    return None if ext == "" else "ini"


def is_ansible_yaml(data: Any) -> bool:
    """True for the data of an Ansible YAML inventory, False for our own format's."""
    if not isinstance(data, dict) or not data:
        return False
    if "all" in data or "plugin" in data:
        return True
    return not _OUR_KEYS & set(data)


# -- group_vars/ and host_vars/ -------------------------------------------------------------------


class _VarsFiles:
    """group_vars/ and host_vars/ beside the inventory file, each file read once."""

    def __init__(self, inv: Inventory, environ: Any, *, enabled: bool = True) -> None:
        # plugins/vars/host_group_vars.py:86-90, utils/path.py:93-108
        self.base = os.path.realpath(os.path.dirname(os.path.abspath(inv.source)))
        self.inv = inv
        self.environ = environ
        self.cache: dict[tuple[str, str], dict[str, Val]] = {}
        self.folders = {sub: enabled and os.path.isdir(os.path.join(self.base, sub))
                        for sub in ("group_vars", "host_vars")}

    def of(self, subdir: str, name: str) -> dict[str, Val]:
        key = (subdir, name)
        if key not in self.cache:
            self.cache[key] = self.load(subdir, name)
        return self.cache[key]

    def load(self, subdir: str, name: str) -> dict[str, Val]:
        """plugins/vars/host_group_vars.py:73-78, 104-141; parsing/dataloader.py:475-507."""
        folder = os.path.join(self.base, subdir)
        if name.startswith(os.sep) or not self.folders[subdir]:
            return {}
        found: list[str] = []
        for ext in ("", ".yml", ".yaml", ".json"):
            path = os.path.join(folder, name) + ext
            if os.path.exists(path):
                found = _dir_files(path) if os.path.isdir(path) else [path]
                break
        out: dict[str, Val] = {}
        for path in found:
            out.update(self.read(path))
        return out

    def read(self, path: str) -> dict[str, Val]:
        try:
            text = read_text(path)
            if text.startswith("$ANSIBLE_VAULT"):
                self.inv.needs_ansible.append("vault")
                self.inv.problem(Location(path, 1, 1), "vault-encrypted vars files are not "
                                 "supported without Ansible", "install ansible-core "
                                 "(orchestrator then reads the inventory with ansible-inventory),"
                                 " decrypt it (ansible-vault decrypt), or give secrets through "
                                 "the environment (!env NAME)")
                return {}
            doc = load_yaml(path, environ=self.environ, yaml11_booleans=True)
        except ConfigError as exc:
            self.inv.problems.extend(exc.problems)
            return {}
        if doc.data is None:
            return {}
        if not isinstance(doc.data, dict):  # utils/vars.py:89 (_validate_mutable_mappings)
            self.inv.problem(doc.loc(), f"a vars file must be a mapping of variables, got "
                             f"{kind_of(doc.data)}", "write NAME: VALUE lines")
            return {}
        self.inv.secrets |= doc.secrets
        index = Inner(doc)
        return {str(k): val_at(doc, (k,), index) for k in doc.data}


def _dir_files(path: str) -> list[str]:
    """parsing/dataloader.py:509-523: sorted, recursive, no hidden or backup files."""
    out: list[str] = []
    for entry in sorted(os.listdir(path)):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        full = os.path.join(path, entry)
        ext = os.path.splitext(entry)[1]
        if os.path.isdir(full) and not ext:
            out.extend(_dir_files(full))
        elif os.path.isfile(full) and (not ext or ext in (".yml", ".yaml", ".json")):
            out.append(full)
    return out


# -- into our format ------------------------------------------------------------------------------


def _merged_vars(
    inv: Inventory, files: _VarsFiles, host: Host, depth: dict[str, int]
) -> dict[str, Val]:
    """A host's variables in Ansible's precedence (vars/manager.py:224-286)."""
    mine = sorted((g for g in inv.groups_of(host) if g.name != "all"),
                  key=lambda g: (depth[g.name], g.priority, g.name))  # inventory/helpers.py:25-26
    out: dict[str, Val] = dict(inv.groups["all"].vars)  # all_inventory
    for g in mine:  # groups_inventory
        out.update(g.vars)
    out.update(files.of("group_vars", "all"))  # all_plugins_inventory
    for g in mine:  # groups_plugins_inventory
        out.update(files.of("group_vars", g.name))
    out.update(host.vars)  # vars/manager.py:284
    out.update(files.of("host_vars", host.name))  # vars/manager.py:285
    return out


def _translate(
    inv: Inventory, environ: Any, *, vars_files: bool = True
) -> tuple[YamlDoc | None, list[ConfigProblem]]:
    """Our format's data for an Ansible inventory, every value located where it was written
    (None without hosts), and the problems found on the way (`vars_files`: read group_vars/
    and host_vars/; ansible-inventory's answer has them already)."""
    files = _VarsFiles(inv, environ, enabled=vars_files)
    doc = YamlDoc(source=inv.source, data=None)
    hosts: dict[str, Any] = {}
    depth = inv.depths()
    if not inv.hosts and not inv.problems:
        inv.problem(Location(inv.source, 1, 1), "the inventory names no hosts",
                    "list hosts under a [group] section (INI) or a group's `hosts:` (YAML)")
    for name, host in inv.hosts.items():
        merged = _merged_vars(inv, files, host, depth)
        hosts[name] = _host_entry(inv, doc, name, host, merged)
    groups: dict[str, Any] = {}
    for name in sorted(inv.groups):  # group_names are sorted (inventory/host.py:146)
        if name == "all":
            continue
        group = inv.groups[name]
        members = inv.members(group)
        groups[name] = {"hosts": members}
        _locate(doc, ("groups", name), group.loc, group.loc)
        _locate(doc, ("groups", name, "hosts"), group.loc, group.loc)
        for i, member in enumerate(members):
            _locate(doc, ("groups", name, "hosts", i), inv.hosts[member].loc)
    doc.data = {"hosts": hosts, "groups": groups}
    doc.secrets |= inv.secrets
    return (doc if hosts else None), inv.problems


def _locate(doc: YamlDoc, path: Path_, loc: Location, key_loc: Location | None = None) -> None:
    doc.locations[path] = loc
    if key_loc is not None:
        doc.key_locations[path] = key_loc


def _host_entry(
    inv: Inventory, doc: YamlDoc, name: str, host: Host, merged: dict[str, Val]
) -> dict[str, Any]:
    base = ("hosts", name)
    _locate(doc, base, host.loc, host.loc)
    entry: dict[str, Any] = {}
    for setting, val in _connection(inv, name, merged).items():
        entry[setting] = val.value
        _locate(doc, (*base, setting), val.loc, val.key_loc)
        for sub, loc in val.inner.items():
            _locate(doc, (*base, setting, *sub), loc)
    variables: dict[str, Any] = {}
    _locate(doc, (*base, "vars"), host.loc, host.loc)
    for key, val in merged.items():
        if key.startswith(_OURS):
            continue
        variables[key] = val.value
        _locate(doc, (*base, "vars", key), val.loc, val.key_loc)
        for sub, loc in val.inner.items():
            _locate(doc, (*base, "vars", key, *sub), loc)
    entry["vars"] = variables
    return entry


# -- connection settings --------------------------------------------------------------------------

_OURS = "orchestrator_"
#: our setting <- Ansible variables, the later one winning (config/manager.py:517-537), and type
_ANSIBLE_SETTINGS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("address", ("ansible_host", "ansible_ssh_host"), "str"),  # connection/ssh.py:29-36
    ("port", ("ansible_port", "ansible_ssh_port"), "int"),  # connection/ssh.py:224-234
    ("user", ("ansible_user", "ansible_ssh_user"), "str"),  # connection/ssh.py:237-249
    ("identity_file", ("ansible_private_key_file", "ansible_ssh_private_key_file"),
     "str"),  # connection/ssh.py:268-279
    ("connect_timeout", ("ansible_ssh_timeout",), "int"),  # connection/ssh.py:371-387
    ("become_password", ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass"),
     "str"),  # become/sudo.py:62-68
)
_PASSWORDS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password")  # ssh.py:58-64
_HOST_KEY_CHECKING = ("ansible_host_key_checking", "ansible_ssh_host_key_checking")  # ssh.py:39-56
#: on ssh's command line in this order (connection/ssh.py:874-879, 930-934; vars :96-121, 192-196)
_SSH_ARGS = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")
_SSH_CONNECTIONS = frozenset({"ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh",
                              "ansible.builtin.paramiko_ssh"})
_LOCAL_CONNECTIONS = frozenset({"local", "ansible.builtin.local"})
_OUR_SETTINGS = ("address", "port", "user", "identity_file", "connection", "host_key_policy",
                 "known_hosts", "ssh_config", "connect_timeout", "connect_budget",
                 "wait_for_host", "lock_path", "become_password", "hypervisor")
#: module_utils/parsing/convert_bool.py:12, read non-strictly (config/manager.py:133-134)
_TRUE = frozenset({"y", "yes", "on", "1", "true", "t"})


def _connection(inv: Inventory, host: str, merged: dict[str, Val]) -> dict[str, Val]:
    """Our host settings from the host's variables (see the module's docstring)."""
    out: dict[str, Val] = {}
    for setting, names, kind in _ANSIBLE_SETTINGS:
        picked = _pick(merged, names)
        if picked is not None:
            name, val = picked
            converted = _convert(inv, host, name, val, kind)
            if converted is not None:
                out[setting] = converted
    picked = _pick(merged, ("ansible_connection",))  # constants.py:148
    if picked is not None:
        conn = _connection_kind(inv, host, picked[1])
        if conn is not None:
            out["connection"] = conn
    picked = _pick(merged, _PASSWORDS)
    if picked is not None:
        inv.problem(picked[1].key_loc, f"host '{host}': {picked[0]}: password logins are not "
                    "supported", "log in with a key (ansible_ssh_private_key_file)")
    picked = _pick(merged, _HOST_KEY_CHECKING)
    if picked is not None and not _truthy(picked[1].value):
        inv.problem(picked[1].loc, f"host '{host}': {picked[0]} is false: orchestrator always "
                    "checks host keys", "remove it; record the keys with ssh-keyscan, or "
                    "trust a new host's key on first use with ansible_ssh_common_args="
                    "'-o StrictHostKeyChecking=accept-new'")
    out.update(_ssh_options(inv, host, merged))
    _become(inv, host, merged)
    for setting in _OUR_SETTINGS:
        val = merged.get(_OURS + setting)
        if val is not None and not _templated(inv, host, _OURS + setting, val):
            out[setting] = val
    return out


#: become variables, each with what orchestrator's become does (constants.py:178-183; the sudo
#: plugin's names, the later winning, and defaults: plugins/become/sudo.py:14-56; the method's
#: default: config/base.yml:609-611): a stage with `become: true` runs through a helper agent
#: started with `sudo -n` (or `sudo -S` with the become password) as root, remote/agent.py
_BECOME_AS_WE_DO: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("ansible_become_method",), "orchestrator escalates with sudo only",
     lambda v: v in ("sudo", "ansible.builtin.sudo")),
    (("ansible_become_user", "ansible_sudo_user"), "orchestrator's become is root only",
     lambda v: v == "root"),
    (("ansible_become_exe", "ansible_sudo_exe"), "orchestrator runs the host's `sudo`",
     lambda v: isinstance(v, str) and os.path.basename(v) == "sudo"),
    (("ansible_become_flags", "ansible_sudo_flags"), "orchestrator runs `sudo -n` (or `sudo -S` "
     "with ansible_become_password) and passes no other flags",
     lambda v: isinstance(v, str) and set(v.split()) <= {"-H", "-S", "-n"}),
)


def _become(inv: Inventory, host: str, merged: dict[str, Val]) -> None:
    """Ansible's become variables that orchestrator cannot honour are refused, not kept as
    mere variables: `ansible_become` (true runs every task as the become user, false turns
    become off even for tasks that ask for it: a variable beats the task's keyword,
    playbook/play_context.py:186-191, 247-258), and a method, user, program or flags other
    than what our become does (sudo to root)."""
    picked = _pick(merged, ("ansible_become",))
    if picked is not None:
        name, val = picked
        if _truthy(val.value):  # a bool: playbook/play_context.py:100, playbook/base.py:470-471
            inv.problem(val.loc, f"host '{host}': {name} is true: orchestrator does not run "
                        "every stage as root", "remove it: a stage that needs root says "
                        "`become: true` in the playbook and uses sudo on its own "
                        "(passwordless, or with ansible_become_password); or log in as root "
                        "(ansible_user=root)")
        else:
            inv.problem(val.loc, f"host '{host}': {name} is false: orchestrator cannot turn "
                        "sudo off for a host (Ansible would, even for tasks with become)",
                        "remove it; the playbook's stages with `become: true` use sudo")
    for names, why, ours in _BECOME_AS_WE_DO:
        picked = _pick(merged, names)
        if picked is not None and not ours(picked[1].value):
            inv.problem(picked[1].loc, f"host '{host}': {picked[0]}={picked[1].value!r}: {why}",
                        f"remove {picked[0]}, or log in as the user the stages should run as "
                        "(ansible_user)")


def _templated(inv: Inventory, host: str, name: str, val: Val) -> bool:
    """A template in a connection setting is an error: settings are not rendered."""
    value = val.value
    if isinstance(value, str) and is_template(value) and not isinstance(value, Data):
        inv.problem(val.loc, f"host '{host}': {name} is a template ({value!r})",
                    "write the value itself: connection settings are not rendered")
        return True
    return False


def _pick(merged: dict[str, Val], names: tuple[str, ...]) -> tuple[str, Val] | None:
    found = None
    for name in names:
        if name in merged and merged[name].value is not None:
            found = (name, merged[name])
    return found


def _truthy(value: Any) -> bool:
    """module_utils/parsing/convert_bool.py:17-34, non-strict: what is not true is false."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE


def _convert(inv: Inventory, host: str, name: str, val: Val, kind: str) -> Val | None:
    """config/manager.py:124-225 (int: a whole number, or text of one; str: text or a number)."""
    value = val.value
    if _templated(inv, host, name, val):
        return None
    if kind == "int":
        number: int | None = None
        if isinstance(value, int):
            number = int(value)
        elif isinstance(value, (float, str)):
            try:
                as_float = float(value)
                number = int(as_float) if as_float.is_integer() else None
            except (ValueError, OverflowError):
                number = None
        if number is None:
            inv.problem(val.loc, f"host '{host}': {name} must be a whole number, got {value!r}",
                        f"e.g. {name}=22" if "port" in name else f"e.g. {name}=10")
            return None
        if "port" in name and not 1 <= number <= 65535:
            inv.problem(val.loc, f"host '{host}': {name} must be a port number (1 to 65535), "
                        f"got {number}", f"e.g. {name}=22")
            return None
        return Val(number, val.loc, val.key_loc)
    if isinstance(value, (bool, int, float)):
        return Val(str(value), val.loc, val.key_loc)
    if not isinstance(value, str):
        inv.problem(val.loc, f"host '{host}': {name} must be text, got {kind_of(value)}",
                    "write it as one string, e.g. '-o UserKnownHostsFile=~/.ssh/known_hosts_lab'"
                    if name in _SSH_ARGS else "write it as one string")
        return None
    return val


def _connection_kind(inv: Inventory, host: str, val: Val) -> Val | None:
    value = val.value
    if value in _SSH_CONNECTIONS:
        return Val("ssh", val.loc, val.key_loc)
    if value in _LOCAL_CONNECTIONS:
        return Val("local", val.loc, val.key_loc)
    inv.problem(val.loc, f"host '{host}': ansible_connection {value!r} is not supported",
                "orchestrator connects with ssh or local")
    return None


def _ssh_options(inv: Inventory, host: str, merged: dict[str, Val]) -> dict[str, Val]:
    """Our settings from the ssh options in the ssh argument variables, read as ssh reads them
    (`config.openssh`): the first value of an option wins, as in ssh; a value that weakens
    host-key checking is refused wherever it is written, as is a proxy (it would be skipped:
    put it in ssh_config) and any line ssh itself would refuse."""
    out: dict[str, Val] = {}
    for name in _SSH_ARGS:
        val = merged.get(name)
        if val is None or val.value is None:
            continue
        val = _convert(inv, host, name, val, "str")
        if val is None:
            continue
        try:  # plugins/connection/__init__.py:122-129
            args = [a.strip() for a in shlex.split(val.value) if a.strip()]
        except ValueError as exc:
            inv.problem(val.loc, f"host '{host}': {name}: {exc}", "close the quote")
            continue
        for line in openssh.argv_options(args):
            try:
                parsed = openssh.config_line(line)
            except ValueError as exc:
                inv.problem(val.loc, f"host '{host}': {name}: -o {line!r}: {exc} (ssh refuses "
                            "it and exits)", "write it as -o Key=Value")
                continue
            if parsed is not None:
                said = _ssh_option(inv, f"host '{host}': {name}: {line.strip()}", val.loc,
                                   *parsed)
                for setting, value in said.items():
                    out.setdefault(setting, Val(value, val.loc, val.key_loc))
    no_system_file = out.pop(_NO_SYSTEM_FILE, None)
    if no_system_file is not None and "known_hosts" not in out:
        # GlobalKnownHostsFile none alone: ssh reads ~/.ssh/known_hosts (readconf.c:2893-2897);
        # our transport reads the system file only when no known_hosts is given
        out["known_hosts"] = Val(_USER_FILE, no_system_file.loc, no_system_file.key_loc)
    return out


_NO_SYSTEM_FILE = " no system file"
_USER_FILE = "~/.ssh/known_hosts"  # pathnames.h:81
_SYSTEM_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")  # pathnames.h:29-31
_ACCEPT_NEW = "use -o StrictHostKeyChecking=accept-new to trust a new host's key on first use"


def _no_file(path: str) -> bool:
    """`none` (ssh.c:1544-1552) or a device such as /dev/null: no key can be kept there."""
    return path.lower() == "none" or os.path.normpath(
        os.path.expanduser(path)).startswith("/dev/")


def _ssh_option(
    inv: Inventory, what: str, loc: Location, key: str, args: list[str]
) -> dict[str, Any]:
    """One ssh option (lower-case keyword, arguments) -> our settings it gives, its problems."""
    value = args[0] if args else ""
    if key == "stricthostkeychecking":
        state = openssh.STRICT_HOST_KEY_CHECKING.get(value.lower())  # readconf.c:1104-1117
        if state is None:
            inv.problem(loc, f"{what}: ssh refuses {value!r} (yes, ask, accept-new, no)",
                        _ACCEPT_NEW)
        elif state == "off":
            inv.problem(loc, f"{what} turns host-key checking off: orchestrator always checks "
                        "host keys", f"remove it; record the keys with ssh-keyscan, or "
                        f"{_ACCEPT_NEW}")
        else:
            return {"host_key_policy": "accept-new" if state == "accept-new" else "strict"}
    elif key == "userknownhostsfile":
        if any(_no_file(a) for a in args):
            inv.problem(loc, f"{what}: no host key would be kept or checked (with accept-new "
                        "every key is trusted, each time)", "name a real file, e.g. "
                        "-o UserKnownHostsFile=~/.ssh/known_hosts_lab, or remove it")
        elif args:
            return {"known_hosts": args[0]}
    elif key == "globalknownhostsfile":
        if all(_no_file(a) for a in args):
            return {_NO_SYSTEM_FILE: True}
        if not set(args) <= set(_SYSTEM_FILES):
            inv.problem(loc, f"{what}: orchestrator reads host keys from "
                        f"{_SYSTEM_FILES[0]} and one UserKnownHostsFile only",
                        "name the file with -o UserKnownHostsFile=PATH instead")
    elif key == "nohostauthenticationforlocalhost" and openssh.FLAG.get(value.lower()):
        inv.problem(loc, f"{what} turns host-key checking off for localhost: orchestrator "
                    "always checks host keys", "remove it")
    elif key == "knownhostscommand":
        inv.problem(loc, f"{what}: orchestrator reads host keys from known_hosts files only",
                    "write the keys into a file and name it with -o UserKnownHostsFile=PATH")
    elif key in ("proxyjump", "proxycommand") and value.lower() != "none":
        inv.problem(loc, f"{what}: a proxy is not supported here", "put the proxy in "
                    "ssh_config (~/.ssh/config, or the file named by orchestrator_ssh_config): "
                    "orchestrator follows its ProxyJump and ProxyCommand")
    return {}
