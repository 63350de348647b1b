"""ssh options in an Ansible inventory's ssh argument variables, read as OpenSSH reads them.

Host-key checking cannot be weakened however the option is spelled: `-oKey=value`, `-o Key
value`, `-o "Key = value"`, bundled `-qo`, any case, in ansible_ssh_args, _common_args or
_extra_args, INI or YAML. What keeps it (StrictHostKeyChecking true/yes/ask/accept-new, a real
UserKnownHostsFile) becomes our settings, the first value of an option winning as in ssh.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_inventory
from orchestrator.config.openssh import argv_options, config_line
from orchestrator.errors import ConfigError

REFUSED = [
    ("-o StrictHostKeyChecking=no", "turns host-key checking off"),
    ("-o StrictHostKeyChecking=off", "turns host-key checking off"),
    ("-o StrictHostKeyChecking=false", "turns host-key checking off"),
    ("-oStrictHostKeyChecking=NO", "turns host-key checking off"),
    ('-o "StrictHostKeyChecking no"', "turns host-key checking off"),
    ('-o "StrictHostKeyChecking = Off"', "turns host-key checking off"),
    ("-o stricthostkeychecking=False", "turns host-key checking off"),
    ("-qo StrictHostKeyChecking=no", "turns host-key checking off"),
    ("-C -o ControlMaster=auto -o StrictHostKeyChecking=no", "turns host-key checking off"),
    # the first value wins in ssh, but a weakening one is refused wherever it is
    ("-o StrictHostKeyChecking=yes -o StrictHostKeyChecking=no", "turns host-key checking off"),
    ("-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=accept-new",
     "no host key would be kept or checked"),
    ("-o UserKnownHostsFile=/dev/null", "no host key would be kept or checked"),
    ("-o UserKnownHostsFile=NONE", "no host key would be kept or checked"),
    ('-o "UserKnownHostsFile ~/.ssh/known_hosts /dev/null"', "no host key would be kept"),
    ("-o userknownhostsfile=/dev/../dev/null", "no host key would be kept or checked"),
    ("-o NoHostAuthenticationForLocalhost=yes", "host-key checking off for localhost"),
    ("-o KnownHostsCommand=/usr/bin/keys", "from known_hosts files only"),
    ("-o GlobalKnownHostsFile=/etc/ssh/lab_keys", "one UserKnownHostsFile only"),
    ("-o StrictHostKeyChecking=maybe", "ssh refuses 'maybe'"),
    ("-o StrictHostKeyChecking=", "no argument after keyword"),
    ('-o "UserKnownHostsFile \'/a b"', "invalid quotes"),
    ("-J jump", "ProxyJump=jump: a proxy is not supported"),
    ("-o ProxyCommand=nc\\ %h\\ %p", "a proxy is not supported"),
]


def write_ini(tmp_path: Path, args: str, variable: str = "ansible_ssh_common_args") -> Path:
    """A [gpu:vars] line: its value is read as a Python literal (plugins/inventory/ini.py:370)."""
    path = tmp_path / "hosts.ini"
    path.write_text(f"[gpu]\nh1\n[gpu:vars]\n{variable}={args!r}\n")
    return path


def messages(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_inventory(path)
    for p in exc.value.problems:
        assert p.location is not None and p.location.file == str(path) and p.hint, p
    return [p.message for p in exc.value.problems]


@pytest.mark.parametrize("variable", ["ansible_ssh_args", "ansible_ssh_common_args",
                                      "ansible_ssh_extra_args"])
@pytest.mark.parametrize(("args", "fragment"), REFUSED, ids=[r[0] for r in REFUSED])
def test_weakening_options_are_refused_in_ini(tmp_path: Path, args: str, fragment: str,
                                              variable: str) -> None:
    found = messages(write_ini(tmp_path, args, variable))
    assert any(fragment in m and variable in m for m in found), found


@pytest.mark.parametrize(("args", "fragment"), REFUSED[:12], ids=[r[0] for r in REFUSED[:12]])
def test_weakening_options_are_refused_in_yaml(tmp_path: Path, args: str, fragment: str) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  hosts:\n    h1:\n      ansible_ssh_extra_args: {json.dumps(args)}\n")
    found = messages(path)
    assert any(fragment in m for m in found), found


def test_the_usual_lab_pattern_is_refused_twice(tmp_path: Path) -> None:
    found = messages(write_ini(tmp_path, "-o UserKnownHostsFile=/dev/null -o "
                               "GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"))
    assert len(found) == 2 and "no host key would be kept" in found[0], found
    assert "turns host-key checking off" in found[1]


def test_ssh_args_as_a_yaml_list_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    h1:\n      ansible_ssh_common_args: "
                    "[-o, StrictHostKeyChecking=no]\n")
    assert any("ansible_ssh_common_args must be text" in m for m in messages(path))


KEPT = [
    ("-o StrictHostKeyChecking=true", "strict", None),
    ("-o StrictHostKeyChecking=Yes", "strict", None),
    ("-o StrictHostKeyChecking=ask", "strict", None),
    ("-oStrictHostKeyChecking=ACCEPT-NEW", "accept-new", None),
    ('-o "StrictHostKeyChecking accept-new"', "accept-new", None),
    ("-o StrictHostKeyChecking=accept-new -o StrictHostKeyChecking=yes", "accept-new", None),
    ("-o UserKnownHostsFile=/k/a -o UserKnownHostsFile=/k/b", "strict", "/k/a"),
    ('-o "UserKnownHostsFile \\"/k/with space\\" /k/other"', "strict", "/k/with space"),
    ("-o GlobalKnownHostsFile=/dev/null", "strict", "~/.ssh/known_hosts"),
    ("-o GlobalKnownHostsFile=none -o UserKnownHostsFile=/k/a", "strict", "/k/a"),
    ("-o GlobalKnownHostsFile=/etc/ssh/ssh_known_hosts", "strict", None),
    ("-o ProxyCommand=none -o NoHostAuthenticationForLocalhost=no", "strict", None),
    ("-- -o StrictHostKeyChecking=no", "strict", None),  # after `--`: not an option
]


@pytest.mark.parametrize(("args", "policy", "known"), KEPT, ids=[k[0] for k in KEPT])
def test_options_that_keep_checking_become_settings(tmp_path: Path, args: str, policy: str,
                                                    known: str | None) -> None:
    host = load_inventory(write_ini(tmp_path, args)).hosts["h1"]
    assert (host.host_key_policy, host.known_hosts) == (policy, known)


def test_the_first_value_wins_across_the_variables_in_ssh_order(tmp_path: Path) -> None:
    # ssh_args come first on ssh's command line, then common args, then extra args
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\nh1 ansible_ssh_extra_args='-o StrictHostKeyChecking=yes' "
                    "ansible_ssh_common_args='-o StrictHostKeyChecking=accept-new "
                    "-o UserKnownHostsFile=/k/common' "
                    "ansible_ssh_args='-o UserKnownHostsFile=/k/args'\n")
    host = load_inventory(path).hosts["h1"]
    assert (host.host_key_policy, host.known_hosts) == ("accept-new", "/k/args")


@pytest.mark.parametrize(("line", "parsed"), [
    ("StrictHostKeyChecking=no", ("stricthostkeychecking", ["no"])),
    ("StrictHostKeyChecking = no", ("stricthostkeychecking", ["no"])),
    ("StrictHostKeyChecking  no  ", ("stricthostkeychecking", ["no"])),
    ('"StrictHostKeyChecking" no', ("stricthostkeychecking", ["no"])),
    ("  StrictHostKeyChecking no", ("stricthostkeychecking", ["no"])),
    ("K==v", ("k", ["=v"])),  # only one '=' is skipped (misc.c:472-480)
    ("UserKnownHostsFile a\\ b 'c d' # comment", ("userknownhostsfile", ["a b", "c d"])),
    ("# a comment", None),
    ('"unclosed no', None),  # ssh skips a line whose keyword's quote is not closed
])
def test_config_line_as_ssh_reads_it(line: str, parsed: tuple | None) -> None:
    assert config_line(line) == parsed


def test_argv_options_as_ssh_getopt_reads_them() -> None:
    args = ["-C", "-vvo", "A=1", "-oB=2", "-p", "-o", "-o", "C=3", "host", "-J", "j", "--",
            "-o", "D=4"]
    # `-p -o`: -o is -p's argument; the host does not end the options; `--` does
    assert argv_options(args) == ["A=1", "B=2", "C=3", "ProxyJump=j"]
