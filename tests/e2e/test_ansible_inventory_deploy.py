"""An Ansible INI inventory, as an Ansible user writes it (groups, children, group_vars/ beside
it, the connection in ansible_* variables), drives a deploy unchanged: over SSH to a simulated
8-GPU host with its host key checked, then again on the converged host."""

from __future__ import annotations

import textwrap
from pathlib import Path

from orchestrator.config import load_inventory
from orchestrator.deploy import deploy
from orchestrator_sim.fleet import SimFleet
from tests.sim.conftest import assert_nothing_left

PLAYBOOK = """\
name: ansible-inventory
stages:
  - id: health
    uses: host_health
    hosts: [cluster]
    with:
      gpus: "{{ expected_gpus }}"
      allow_busy_gpus: true
  - id: greet
    needs: [health]
    hosts: [gpu]
    run: mkdir -p {{ base_dir }} && printf '%s\\n' {{ greeting }} > {{ base_dir }}/greeting.txt
    check: printf '%s\\n' {{ greeting }} | cmp -s - {{ base_dir }}/greeting.txt
"""


def write_ansible_inventory(fleet: SimFleet, folder: Path) -> Path:
    """The simulator's host (from the inventory it writes in our format) as an Ansible INI
    inventory with group_vars/."""
    (spec,) = load_inventory(fleet.inventory_path).hosts.values()
    folder.mkdir()
    inventory = folder / "hosts.ini"
    inventory.write_text(textwrap.dedent(f"""\
        [gpu]
        {spec.name} ansible_host={spec.address} ansible_port={spec.port}

        [gpu:vars]
        expected_gpus=8
        greeting=from-the-inline-group-vars

        [cluster:children]
        gpu

        [all:vars]
        ansible_user={spec.user}
        ansible_ssh_private_key_file={spec.identity_file}
        ansible_ssh_common_args='-o UserKnownHostsFile={spec.known_hosts}'
        """))
    (folder / "group_vars" / "gpu").mkdir(parents=True)
    # group_vars/ files come after every inline group var (vars/manager.py:274-281)
    (folder / "group_vars" / "gpu" / "main.yml").write_text(
        f"greeting: hello from group_vars\nbase_dir: {spec.vars['base_dir']}\n")
    return inventory


def test_an_ansible_ini_inventory_drives_a_deploy(tmp_path: Path) -> None:
    fleet = SimFleet.up(tmp_path / "sim", hosts=1, time_scale=0.001, index=False, hub=False,
                        hypervisor=False)
    try:
        inventory = write_ansible_inventory(fleet, tmp_path / "ansible")
        playbook = tmp_path / "playbook.yaml"
        playbook.write_text(PLAYBOOK)

        first = deploy(playbook, inventory, run_dir=tmp_path / "runs")
        assert first.exit_code == 0, first.summary
        assert first.statuses("gpu-1") == {"health": "ok", "greet": "changed"}
        base_dir = load_inventory(fleet.inventory_path).hosts["gpu-1"].vars["base_dir"]
        done = fleet.ssh("gpu-1", f"cat {base_dir}/greeting.txt")
        assert done.stdout == "hello from group_vars\n", done.stderr

        again = deploy(playbook, inventory, run_dir=tmp_path / "runs")
        assert again.exit_code == 0, again.summary
        assert again.statuses("gpu-1") == {"health": "ok", "greet": "ok"}
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)
