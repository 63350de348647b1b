"""Inventories read by the real ansible-inventory (a subprocess; ansible-core is never imported)
come out as the built-in reader's do, with the same rules; what only Ansible reads (inventory
directories with their own group_vars/, vault) then works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.config import load_inventory
from orchestrator.config.ansible_cli import check_owned, find_tool, from_list, read_with_ansible
from orchestrator.config.ansible_parse import IniReader
from orchestrator.errors import ConfigError

TOOL = find_tool()
needs_ansible = pytest.mark.skipif(
    TOOL is None, reason="ansible-core is not installed: no ansible-inventory beside this Python "
    "or on PATH (the dev extra installs it: pip install -e '.[dev]', Python >= 3.11)")
MAGIC = {"inventory_file", "inventory_dir"}

HOSTS = """\
lonely ansible_host=10.0.0.9
[gpu]
gpu[01:02].lab ansible_user=root
special:2222 ansible_host=10.0.0.5 weight=3 label="a b"
[gpu:vars]
sglang_port=30000
[cluster:children]
gpu
router
[router]
r1 ansible_host=10.0.0.100 ansible_connection=local
[all:vars]
base_dir=/opt/x
ansible_ssh_common_args='-o StrictHostKeyChecking=accept-new'
"""
GROUP_VARS = {"all.yml": "hf_endpoint: https://hf\n", "gpu.yml": "base_dir: /opt/gpu\nflag: on\n"}


def write_case(folder: Path) -> Path:
    (folder / "group_vars").mkdir(parents=True)
    for name, text in GROUP_VARS.items():
        (folder / "group_vars" / name).write_text(text)
    (folder / "hosts.ini").write_text(HOSTS)
    return folder / "hosts.ini"


def summary(inv) -> dict:
    return {"hosts": {n: ({k: v for k, v in h.vars.items() if k not in MAGIC},
                          h.model_dump(exclude={"vars", "name"}))
                      for n, h in inv.hosts.items()},
            "groups": {g: sorted(inv.group_members(g)) for g in inv.group_names()}}


@needs_ansible
def test_an_inventory_directory_reads_as_the_same_plain_file(tmp_path: Path,
                                                             monkeypatch) -> None:
    plain = load_inventory(write_case(tmp_path / "plain"))  # the built-in reader (conftest)
    monkeypatch.setenv("ORCHESTRATOR_ANSIBLE_INVENTORY", "auto")
    folder = tmp_path / "inventory.d"
    write_case(folder)
    from_ansible = load_inventory(folder)  # only ansible-inventory reads a directory
    assert summary(from_ansible) == summary(plain)
    assert from_ansible.hosts["special"].host_key_policy == "accept-new"
    assert from_ansible.hosts["gpu01.lab"].vars["base_dir"] == "/opt/gpu"  # group_vars/ inside
    assert from_ansible.hosts["r1"].vars["inventory_dir"] == str(folder)
    monkeypatch.setenv("ORCHESTRATOR_ANSIBLE_INVENTORY", "always")
    assert summary(load_inventory(tmp_path / "plain" / "hosts.ini")) == summary(plain)


@needs_ansible
def test_vault_through_ansible_and_its_values_are_secrets(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ANSIBLE_INVENTORY", "auto")
    path = write_case(tmp_path)
    (tmp_path / "pass").write_text("pw\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "pass"))
    vault = str(Path(TOOL).with_name("ansible-vault"))
    secret = tmp_path / "group_vars" / "gpu.yml"
    secret.write_text("base_dir: /opt/gpu\nhf_token: hf_s3cr3t_value\n")
    subprocess.run([vault, "encrypt", str(secret)], check=True, capture_output=True)
    inline = subprocess.run([vault, "encrypt_string", "inl1ne-secret", "--name", "api_key"],
                            check=True, capture_output=True, text=True).stdout
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "r1.yml").write_text(inline)
    inv = load_inventory(path)
    assert inv.hosts["gpu01.lab"].vars["hf_token"] == "hf_s3cr3t_value"
    assert inv.hosts["r1"].vars["api_key"] == "inl1ne-secret"
    assert {"hf_s3cr3t_value", "inl1ne-secret"} <= inv._secret_values
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE")
    with pytest.raises(ConfigError, match="vault"):
        load_inventory(path)


@needs_ansible
def test_the_same_rules_apply_to_what_ansible_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ANSIBLE_INVENTORY", "auto")
    folder = tmp_path / "inventory.d"
    folder.mkdir()
    (folder / "hosts").write_text("[gpu]\nh1 ansible_become=true ansible_ssh_extra_args="
                                  "'-o UserKnownHostsFile=/dev/null'\n")
    with pytest.raises(ConfigError) as exc:
        load_inventory(folder)
    text = " ".join(p.message for p in exc.value.problems)
    assert "ansible_become is true" in text and "no host key would be kept" in text
    assert all(p.location is not None and p.location.file == str(folder)
               for p in exc.value.problems)


def test_ansible_inventory_json_maps_onto_the_built_in_reading(tmp_path: Path) -> None:
    """Without Ansible: the --list JSON of the case (as ansible-core 2.19.0 printed it) gives
    the Inventory the built-in reader gives for the INI alone."""
    path = tmp_path / "hosts.ini"
    path.write_text(HOSTS)
    hostvars = {}
    builtin = IniReader(str(path), HOSTS).read()
    for name, host in builtin.hosts.items():
        merged = {}
        for g in sorted((g for g in builtin.groups_of(host) if g.name != "all"),
                        key=lambda g: g.name):
            merged.update({k: v.value for k, v in g.vars.items()})
        hostvars[name] = {**{k: v.value for k, v in builtin.groups["all"].vars.items()},
                          **merged, **{k: v.value for k, v in host.vars.items()
                                       if k not in MAGIC}}
    listed = {"_meta": {"hostvars": hostvars}, "all": {"children": ["ungrouped", "cluster"]},
              "ungrouped": {"hosts": ["lonely"]}, "cluster": {"children": ["gpu", "router"]},
              "gpu": {"hosts": ["gpu01.lab", "gpu02.lab", "special"]},
              "router": {"hosts": ["r1"]}}
    inv = from_list(str(path), json.loads(json.dumps(listed)))
    for name, host in builtin.hosts.items():
        assert {g.name for g in inv.groups_of(inv.hosts[name])} == \
            {g.name for g in builtin.groups_of(host)}, name
        assert inv.hosts[name].vars["inventory_dir"].value == str(tmp_path)
    assert inv.members(inv.groups["cluster"]) == builtin.members(builtin.groups["cluster"])


def test_find_tool_prefers_this_virtual_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    fake = tmp_path / "ansible-inventory"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    here = Path(os.path.dirname(os.sys.executable)) / "ansible-inventory"
    assert find_tool() == (str(here) if here.exists() else shutil.which("ansible-inventory"))


def test_what_another_user_could_write_is_not_handed_to_ansible(tmp_path: Path) -> None:
    """Ansible runs inventory scripts and plugins: a group- or world-writable file in the
    source refuses the read before ansible-inventory starts."""
    folder = tmp_path / "inventory.d"
    write_case(folder)
    check_owned(str(folder))  # ours, 0644/0755: fine
    loose = folder / "group_vars" / "gpu.yml"
    loose.chmod(0o666)
    with pytest.raises(ConfigError) as err:
        check_owned(str(folder))
    text = err.value.render()
    assert f"{loose} is writable by group or others" in text and "chmod go-w" in text
    with pytest.raises(ConfigError):
        read_with_ansible("/nonexistent/ansible-inventory", str(folder))  # refused first
