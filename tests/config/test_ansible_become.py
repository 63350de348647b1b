"""Ansible's become variables in an inventory: honoured where our become does the same (sudo to
root, the password), refused with the reason and the fix where it does not; never kept as mere
variables that change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_inventory
from orchestrator.errors import ConfigError


def inventory(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "hosts.ini"
    path.write_text(f"[gpu]\nh1 ansible_user=deploy\n[gpu:vars]\n{line}\n")
    return path


REFUSED = [
    ("ansible_become=true", "ansible_become is true: orchestrator does not run every stage"),
    ("ansible_become=yes", "ansible_become is true"),
    ("ansible_become=False", "ansible_become is false: orchestrator cannot turn sudo off"),
    ("ansible_become_method=su", "ansible_become_method='su': orchestrator escalates with sudo"),
    ("ansible_become_method=doas", "escalates with sudo only"),
    ("ansible_become_user=postgres", "ansible_become_user='postgres': orchestrator's become"),
    ("ansible_sudo_user=admin", "ansible_sudo_user='admin': orchestrator's become is root"),
    ("ansible_become_exe=/opt/bin/pbrun", "orchestrator runs the host's `sudo`"),
    ("ansible_become_flags='-i -u x'", "passes no other flags"),
    ("ansible_sudo_flags=-E", "passes no other flags"),
]


@pytest.mark.parametrize(("line", "fragment"), REFUSED, ids=[r[0] for r in REFUSED])
def test_become_that_we_cannot_honour_is_refused(tmp_path: Path, line: str,
                                                 fragment: str) -> None:
    path = inventory(tmp_path, line)
    with pytest.raises(ConfigError) as exc:
        load_inventory(path)
    (problem,) = exc.value.problems
    assert fragment in problem.message and problem.hint
    assert (problem.location.file, problem.location.line) == (str(path), 4)


def test_become_in_yaml_is_refused_where_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    ansible_become: yes\n  hosts:\n    h1:\n")
    with pytest.raises(ConfigError) as exc:
        load_inventory(path)
    (problem,) = exc.value.problems
    assert "ansible_become is true" in problem.message
    assert (problem.location.line, problem.location.column) == (3, 21)


@pytest.mark.parametrize("line", [
    "ansible_become_method=sudo", "ansible_become_user=root", "ansible_become_exe=/usr/bin/sudo",
    "ansible_become_flags='-H -S -n'", "ansible_sudo_pass=s3cret",
])
def test_become_as_we_do_it_is_accepted(tmp_path: Path, line: str) -> None:
    host = load_inventory(inventory(tmp_path, line)).hosts["h1"]
    name, value = line.split("=", 1)
    if name == "ansible_sudo_pass":  # plugins/become/sudo.py:62-68
        assert host.become_password == "s3cret"
    else:
        assert host.vars[name] == value.strip("'")
