"""Ansible inventories as they are (INI, YAML, group_vars/, host_vars/), read by `-i`.

Each folder of tests/config/ansible/ is an inventory with what the REAL ansible-core 2.19.0 made
of it (`ansible-inventory --list`, recorded by scripts/record_ansible_inventories.py): every
host's variables and every group's hosts must come out the same here. The rest: connection
settings, where values are located, and the problems, each at its file:line:column.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.config import host_variables, load_all, load_inventory
from orchestrator.config.ansible import is_ansible_yaml
from orchestrator.config.ansible_parse import expand_host_pattern
from orchestrator.errors import ConfigError

CASES = Path(__file__).parent / "ansible"
RECORD = "ansible-inventory.json"
#: magic variables ansible-inventory --list leaves out (inventory/data.py:197-202)
MAGIC = {"inventory_file", "inventory_dir"}


def case_inventory(case: Path) -> Path:
    (path,) = [p for p in case.iterdir() if p.is_file() and p.name != RECORD]
    return path


def members(groups: dict, name: str) -> set[str]:
    """A recorded group's hosts, with those of its children (inventory/group.py:249-261)."""
    found = set(groups[name]["hosts"])
    for child in groups[name]["children"]:
        found |= members(groups, child)
    return found


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_same_hosts_groups_and_variables_as_real_ansible(case: str) -> None:
    record = json.loads((CASES / case / RECORD).read_text())
    inventory = load_inventory(case_inventory(CASES / case))
    assert sorted(inventory.hosts) == sorted(record["hostvars"])
    for name, expected in record["hostvars"].items():
        got = {k: v for k, v in inventory.hosts[name].vars.items() if k not in MAGIC}
        assert got == expected, name
    for name in record["groups"]:
        if name != "all":
            assert set(inventory.groups[name].hosts) == members(record["groups"], name), name
    for name in set(inventory.groups) - set(record["groups"]):  # --list leaves out empty ones
        assert inventory.groups[name].hosts == [], name


def test_connection_settings_from_ansible_variables() -> None:
    inv = load_inventory(CASES / "ini-groups" / "hosts")
    special, gpu01, r1 = inv.hosts["special"], inv.hosts["gpu01.lab"], inv.hosts["r1"]
    assert (special.address, special.port, special.identity_file) == (
        "10.0.0.5", 2222, "~/.ssh/id_ed25519")
    # ansible_ssh_common_args in host_vars/special.yml
    assert (special.known_hosts, special.host_key_policy) == ("/tmp/kh", "accept-new")
    assert (gpu01.address, gpu01.user, gpu01.port) == (None, "root", None)
    assert (r1.connection, r1.address) == ("local", "10.0.0.100")
    assert inv.hosts["lonely"].groups == [] and inv.group_members("ungrouped") == ["lonely"]
    assert special.vars["inventory_dir"] == str(CASES / "ini-groups")


def test_aliases_and_our_own_settings(tmp_path: Path) -> None:
    inv = write(tmp_path, "inventory.yaml", """\
        all:
          hosts:
            box:
              ansible_host: 10.0.0.1
              ansible_ssh_host: 10.0.0.2        # the later name wins (config/manager.py:517)
              ansible_port: "2200"
              ansible_ssh_user: admin
              ansible_ssh_timeout: 7
              ansible_become_pass: s3cret
              orchestrator_hypervisor: {host: pve, ctid: 101}
              orchestrator_wait_for_host: 5m
            pve:
              ansible_ssh_common_args: -oUserKnownHostsFile=/k/known -o "StrictHostKeyChecking yes"
        """)
    got = load_inventory(inv)
    box, pve = got.hosts["box"], got.hosts["pve"]
    assert (box.address, box.port, box.user, box.connect_timeout) == ("10.0.0.2", 2200, "admin", 7)
    assert box.become_password == "s3cret" and box.wait_for_host == 300
    assert (box.hypervisor.host, box.hypervisor.ctid) == ("pve", 101)
    assert "orchestrator_hypervisor" not in box.vars and box.vars["ansible_ssh_user"] == "admin"
    assert (pve.known_hosts, pve.host_key_policy) == ("/k/known", "strict")


def test_values_are_located_where_written() -> None:
    case = CASES / "ini-groups"
    special = load_inventory(case / "hosts").hosts["special"]
    assert str(special.location) == f"{case}/hosts:6:1"
    assert str(special.location_of("port")) == f"{case}/hosts:6:1"  # special:2222
    assert str(special.location_of("address")) == f"{case}/hosts:6:27"
    assert str(special.location_of("vars", "label")) == f"{case}/hosts:6:51"
    assert str(special.location_of("vars", "sglang_port")) == f"{case}/hosts:8:13"
    assert str(special.location_of("vars", "weight")) == f"{case}/host_vars/special.yml:1:9"
    assert str(special.location_of("known_hosts")) == f"{case}/host_vars/special.yml:2:26"
    gpu = load_inventory(case / "hosts").groups["gpu"]
    assert str(gpu.location) == f"{case}/hosts:4:1"


def test_a_playbook_runs_on_ansible_groups_with_their_variables(tmp_path: Path) -> None:
    playbook = write(tmp_path, "pb.yaml", """\
        name: p
        stages:
          - id: s
            hosts: [cluster]
            run: echo {{ base_dir }} {{ extra[1] }} {{ group_names | join(',') }}
        """)
    pb, inv = load_all(playbook, CASES / "ini-groups" / "hosts")
    assert inv.group_members("cluster") == ["gpu01.lab", "gpu02.lab", "gpu03.lab", "special",
                                            "r1"]
    got = host_variables(pb, inv, "gpu02.lab")
    assert (got["base_dir"], got["extra"], got["on_flag"]) == ("/opt/gpu", [1, 2], True)
    assert got["group_names"] == ["cluster", "gpu"]  # sorted, as Ansible's (inventory/host.py:146)


def test_our_own_yaml_format_is_read_as_before() -> None:
    ours = {"hosts": {"gpu-1": {"address": "127.0.0.2"}}, "groups": {"gpu": {"hosts": ["gpu-1"]}}}
    assert not is_ansible_yaml(ours)
    assert is_ansible_yaml({"all": {"hosts": {"a": None}}})
    assert is_ansible_yaml({"gpu": {"hosts": {"a": None}}, "db": None})
    assert not is_ansible_yaml({"hosts": {"a": None}, "gpu": {"hosts": {"a": None}}})


@pytest.mark.parametrize(("pattern", "names", "port"), [
    ("gpu[01:03]", ["gpu01", "gpu02", "gpu03"], None),
    ("db-[a:c].lab:2222", ["db-a.lab", "db-b.lab", "db-c.lab"], 2222),
    ("n[0:6:3]x[1:2]", ["n0x1", "n0x2", "n3x1", "n3x2", "n6x1", "n6x2"], None),
    ("10.0.0.[1:2]", ["10.0.0.1", "10.0.0.2"], None),
    ("[fe80::1]:22", ["fe80::1"], 22),
    ("fe80::1", ["fe80::1"], None),
    ("odd@name:22", ["odd@name:22"], None),  # not a host[:port]: a name (__init__.py:285-290)
])
def test_host_patterns(pattern: str, names: list[str], port: int | None) -> None:
    assert expand_host_pattern(pattern) == (names, port)


INI_PROBLEMS = [
    ("[gpu:hostz]\nh1\n", 1, 6, "section [gpu:hostz] has unknown type 'hostz'"),
    ("[gpu]\nh1 ansible_port 22\n", 2, 4, "host 'h1': expected key=value, got 'ansible_port'"),
    ("[gpu]\nh1 label=\"open\n", 2, 1, "No closing quotation"),
    ("[gpu]\nh1\n[gpu:children]\ngpu\n", 4, 1, "group 'gpu' is listed as its own child"),
    ("[a]\nh1\n[a:children]\nb\n[b:children]\na\n", 6, 1, "makes a loop"),
    ("[gpu]\nh1\n[all:children]\n  never\n", 4, 3, "lists group 'never', which is never"),
    ("[gpu]\nh1\n[ghost:vars]\nx=1\n", 3, 1, "section [ghost:vars] is for group 'ghost'"),
    # a group name is kept as written (plugins/inventory/ini.py:186): my-group is not my_group
    ("[my-group]\nh1\n[all:children]\nmy_group\n", 4, 1, "lists group 'my_group'"),
    ("[gpu]\nh1\n[gpu:vars]\njust-a-word\n", 4, 1, "[gpu:vars]: expected key=value"),
    ("[gpu]\ngpu[01:1]\n", 2, 1, "equal-length begin and end"),
    ("[gpu]\nh1:\n", 2, 1, "ends in ':'"),
    ("[ gpu ]\nh1\n", 1, 1, "invalid section header"),
    ("[gpu]\nh1 ansible_port=abc\n", 2, 17, "ansible_port must be a whole number, got 'abc'"),
    ("[gpu]\nh1 ansible_port=70000\n", 2, 17, "must be a port number (1 to 65535), got 70000"),
    ("[gpu]\nh1 ansible_ssh_pass=x\n", 2, 4, "password logins are not supported"),
    ("[gpu]\nh1\n[gpu:vars]\nansible_host_key_checking=False\n", 4, 27,
     "ansible_host_key_checking is false"),
    ("[gpu]\nh1 ansible_ssh_extra_args='-o StrictHostKeyChecking=no'\n", 2, 27,
     "StrictHostKeyChecking=no turns host-key checking off"),
    ("[gpu]\nh1 ansible_ssh_common_args='-J jump'\n", 2, 28, "ProxyJump=jump: a proxy is not"),
    ("[gpu]\nh1 ansible_host='{{ ip }}'\n", 2, 17, "ansible_host is a template"),
    ("[gpu]\nh1 ansible_connection=winrm\n", 2, 23, "ansible_connection 'winrm' is not"),
    ("[gpu]\nh1\n[gpu:vars]\nansible_group_priority=high\n", 4, 24,
     "ansible_group_priority must be a whole number"),
    ("[gpu]\nh1 my-var=1\n", 2, 4, "variable name 'my-var' cannot be used in templates"),
    ("[gpu]\nh1\n[other]\ngpu\n", 1, 1, "'gpu' is the name of both a group and a host"),
    ("# only a comment\n", 1, 1, "the inventory names no hosts"),
]


@pytest.mark.parametrize(("text", "line", "column", "fragment"), INI_PROBLEMS,
                         ids=[p[3][:40] for p in INI_PROBLEMS])
def test_ini_problems_are_located(tmp_path: Path, text: str, line: int, column: int,
                                  fragment: str) -> None:
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    problem = only_problem(path, fragment)
    assert (problem.location.file, problem.location.line, problem.location.column) == (
        str(path), line, column), problem
    assert problem.hint


YAML_PROBLEMS = [
    ("gpu:\n  host:\n    h1:\n", 2, 3, "group 'gpu': unknown key 'host'"),
    ("gpu:\n  hosts: [h1]\n", 2, 10, "group 'gpu', hosts: expected a mapping, got a list"),
    ("gpu:\n  hosts:\n    h1: [1]\n", 3, 9, "host 'h1': expected a mapping of variables"),
    ("all:\n  children:\n    gpu: 3\n", 3, 10, "group 'gpu': expected a mapping"),
    ("plugin: amazon.aws.aws_ec2\n", 1, 1, "the configuration of the inventory plugin"),
    ("all:\n  hosts:\n    h1: {ansible_port: 22x}\n", 3, 24, "ansible_port must be a whole"),
    ("all:\n  children:\n    a:\n      children:\n        a:\n", 5, 9, "its own child"),
]


@pytest.mark.parametrize(("text", "line", "column", "fragment"), YAML_PROBLEMS,
                         ids=[p[3][:40] for p in YAML_PROBLEMS])
def test_yaml_problems_are_located(tmp_path: Path, text: str, line: int, column: int,
                                   fragment: str) -> None:
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    problem = only_problem(path, fragment)
    assert (problem.location.line, problem.location.column) == (line, column), problem


def test_vars_file_problems_are_located_in_those_files(tmp_path: Path) -> None:
    inv = write(tmp_path, "inventory.ini", "[gpu]\nh1\n[db]\nd1\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text("- a list\n")
    (tmp_path / "group_vars" / "all.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    (tmp_path / "host_vars" / "d1.yaml").write_text("x: [1,\n")
    (tmp_path / "group_vars" / "db").mkdir()
    (tmp_path / "group_vars" / "db" / "main.yml").write_text("a: 1\na: 2\n")
    problems = problems_of(inv)
    where = {(Path(p.location.file).relative_to(tmp_path).as_posix(), p.location.line):
             p.message for p in problems}
    assert "vault-encrypted" in where[("group_vars/all.yml", 1)]
    assert "must be a mapping" in where[("group_vars/gpu.yml", 1)]
    assert "duplicate key 'a'" in where[("group_vars/db/main.yml", 2)]
    assert "YAML syntax error" in where[("host_vars/d1.yaml", 2)]


def test_what_only_ansible_reads_is_refused_without_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ANSIBLE_INVENTORY", "never")
    (tmp_path / "inv.toml").write_text("[all]\n")
    (tmp_path / "vaulted").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    script = tmp_path / "inventory.py"
    script.write_text("#!/usr/bin/env python3\nprint('{}')\n")
    script.chmod(0o755)
    for path, what in [(tmp_path / "inv.toml", "a TOML inventory"),
                       (tmp_path / "vaulted", "a vault-encrypted inventory"),
                       (script, "an inventory script"), (tmp_path, "is a directory")]:
        (problem,) = problems_of(path)
        assert what in problem.message and "only Ansible reads" in problem.message, problem
        assert "install ansible-core" in problem.hint


# -- helpers -------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path) -> list:
    with pytest.raises(ConfigError) as exc:
        load_inventory(path)
    return exc.value.problems


def only_problem(path: Path, fragment: str):
    problems = problems_of(path)
    found = [p for p in problems if fragment in p.message]
    assert len(found) == 1, [f"{p.location}: {p.message}" for p in problems]
    return found[0]
