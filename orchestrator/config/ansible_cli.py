"""An inventory read by Ansible itself: `ansible-inventory -i SOURCE --list`, run as a program.

ansible-core is GPL-3.0: it is never imported, only run, when it is installed (an
`ansible-inventory` beside this Python, i.e. in the same virtual environment, else on PATH).
`config.ansible` hands it what only Ansible reads (inventory directories, vault, inventory
plugins and scripts, TOML); `ORCHESTRATOR_ANSIBLE_INVENTORY` says when (`auto`, the default:
only then; `always`: every Ansible inventory; `never`: the built-in reader alone).

Its JSON (ansible-core 2.19.0, lib/ansible/cli/inventory.py:190-204, 265-305: `_meta.hostvars`
holds each host's variables resolved in Ansible's precedence, group_vars/ and host_vars/ files
included, for hosts that have any; each group its own `hosts` and `children`) becomes the
same `Inventory` the built-in reader builds, so that the same rules (connection settings,
refusals) and the loader's checks apply; every value is located at the source (Ansible does
not say where it was written).
Values Ansible leaves encrypted (`!vault` ones: `{"__ansible_vault": ...}`) are decrypted with
`ansible-vault decrypt`, and they and every value of a vault-encrypted vars file (read with
`ansible-vault view`) are secrets, masked in every output. Ansible finds the vault password as it
always does (ANSIBLE_VAULT_PASSWORD_FILE, ansible.cfg); a failure is one located problem with
its last error lines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from orchestrator.config.ansible_parse import Inventory, Val
from orchestrator.config.templating import Data
from orchestrator.errors import ConfigError, ConfigProblem, Location

ENV = "ORCHESTRATOR_ANSIBLE_INVENTORY"
MODES = ("auto", "always", "never")
TIMEOUT_S = 300.0
_VAULT = "$ANSIBLE_VAULT"
_VAULT_KEY = "__ansible_vault"  # _internal/_json/_profiles/_legacy.py:97: an encrypted value
#: unreadable sources fail instead of leaving an empty inventory (config/base.yml:1720-1728,
#: 1766-1773)
_STRICT = {"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
           "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True", "ANSIBLE_NOCOLOR": "True"}


def mode(environ: Mapping[str, str] | None) -> str:
    value = (environ if environ is not None else os.environ).get(ENV, "auto").strip().lower()
    if value not in MODES:
        raise ConfigError([ConfigProblem(None, f"{ENV}={value!r} is not one of "
                                         f"{', '.join(MODES)}", f"e.g. {ENV}=auto")])
    return value


def find_tool(name: str = "ansible-inventory") -> str | None:
    """`name` beside this Python (the same virtual environment), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which(name)


def _run(argv: list[str], source: str, what: str, stdin: str | None = None) -> str:
    env = {**os.environ, **_STRICT}
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env,
                              timeout=TIMEOUT_S, stdin=None if stdin is not None
                              else subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError([ConfigProblem(Location(source, 1, 1), f"{what}: {exc}")]) from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()][-6:]
        raise ConfigError([ConfigProblem(
            Location(source, 1, 1), f"{what} failed (exit {done.returncode}): "
            + " | ".join(lines), "a vault needs its password (ANSIBLE_VAULT_PASSWORD_FILE or "
            "ansible.cfg's vault_password_file); run the same command to see all it says")])
    return done.stdout


def check_owned(source: str) -> None:
    """Ansible runs inventory scripts and plugins it finds in SOURCE: refuse one that another
    user could have written (the file, or the directory and everything under it, owned by
    someone other than us or root, or writable by group or others), as the agent's code cache
    is refused (ARCHITECTURE.md, remote/)."""
    paths = [source]
    if os.path.isdir(source):
        for top, dirs, files in os.walk(source):
            paths += [os.path.join(top, n) for n in dirs + files]
    for path in paths:
        st = os.stat(path)
        foreign = st.st_uid not in (os.geteuid(), 0)
        if foreign or st.st_mode & 0o022:
            how = f"owned by uid {st.st_uid}" if foreign else "writable by group or others"
            raise ConfigError([ConfigProblem(
                Location(source, 1, 1),
                f"{path} is {how}, and Ansible may run what it finds there (inventory "
                "scripts, plugins)",
                f"chmod go-w {path} (and keep it yours), or give a static INI or YAML "
                "inventory file")])


def read_with_ansible(tool: str, source: str) -> Inventory:
    """SOURCE (a file or an inventory directory) as `ansible-inventory --list` reads it,
    once check_owned says nobody else could have written it."""
    check_owned(source)
    out = _run([tool, "-i", source, "--list"], source, f"{os.path.basename(tool)} -i {source}")
    try:
        data = json.loads(out)
    except ValueError as exc:
        raise ConfigError([ConfigProblem(Location(source, 1, 1), f"ansible-inventory printed "
                                         f"no JSON: {exc}")]) from None
    inv = from_list(source, data)
    vault = os.path.join(os.path.dirname(tool), "ansible-vault")
    _decrypt(inv, vault, source)
    inv.secrets |= _vaulted_file_values(vault, source)
    return inv


def from_list(source: str, data: dict[str, Any]) -> Inventory:
    """The `Inventory` of ansible-inventory's `--list` JSON (values located at SOURCE)."""
    inv = Inventory(source)
    if os.path.isdir(source):  # inventory/data.py:197-199 name the file; a directory is itself
        inv.dir = Data(os.path.abspath(source))
    loc = Location(source, 1, 1)
    groups = {k: v for k, v in data.items() if k != "_meta" and isinstance(v, dict)}
    for name in groups:
        inv.add_group(name, loc)
    for name, group in groups.items():
        for child in group.get("children", []):
            inv.add_group(child, loc)
            inv.add_child(name, child, loc)
        for host in group.get("hosts", []):
            inv.add_host(host, name, None, loc)
    for host, variables in data.get("_meta", {}).get("hostvars", {}).items():
        entry = inv.hosts.get(host) or inv.add_host(host, "ungrouped", None, loc)
        if entry is not None:
            for key, value in variables.items():
                inv.set_var(entry, key, Val(value, loc, loc))
    inv.reconcile()
    return inv


def _decrypt(inv: Inventory, vault: str, source: str) -> None:
    """Decrypt the values Ansible left encrypted (inline `!vault`), each a secret."""
    for host in inv.hosts.values():
        for key, val in host.vars.items():
            if isinstance(val.value, dict) and set(val.value) == {_VAULT_KEY}:
                text = _run([vault, "decrypt", "--output", "-"], source,
                            f"ansible-vault decrypt ({host.name}: {key})",
                            stdin=str(val.value[_VAULT_KEY]))
                val.value = text
                inv.secrets.add(text)


def _vaulted_file_values(vault: str, source: str) -> set[str]:
    """The text values of the vault-encrypted files among the vars files Ansible read."""
    import yaml

    base = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    found: set[str] = set()
    for top in ("group_vars", "host_vars", *([""] if os.path.isdir(source) else [])):
        for folder, dirs, files in os.walk(os.path.join(base, top)):
            dirs[:] = [d for d in dirs if not d.startswith(".")] if top else []
            for name in files:
                path = os.path.join(folder, name)
                try:
                    with open(path, "rb") as fh:
                        vaulted = fh.read(len(_VAULT)) == _VAULT.encode()
                except OSError:
                    continue
                if vaulted:
                    text = _run([vault, "view", path], path, f"ansible-vault view {path}")
                    try:
                        found |= set(_strings(yaml.safe_load(text)))
                    except yaml.YAMLError:
                        found |= {ln.split("=", 1)[-1].strip() for ln in text.splitlines()}
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []
