#!/usr/bin/env python3
"""Record what the REAL Ansible makes of each inventory in tests/config/ansible/<case>/.

Usage: python scripts/record_ansible_inventories.py [--ansible-inventory PATH]

For every case folder (one inventory file, with group_vars/ and host_vars/ beside it) this runs
`ansible-inventory -i FILE --list` (ansible-core 2.19.0: `pip install ansible-core==2.19.0` in a
virtual environment of its own) and writes the case's `ansible-inventory.json`: each host's
variables as Ansible resolves them, and each group's own hosts and children.
tests/config/test_ansible_inventory.py reads our translation of the same files against it, so
a difference from real Ansible fails there, with no Ansible installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = Path(__file__).resolve().parents[1] / "tests" / "config" / "ansible"
RECORD = "ansible-inventory.json"


def inventory_file(case: Path) -> Path:
    """The case's inventory: the one file at its top level that is not the record."""
    files = [p for p in case.iterdir() if p.is_file() and p.name != RECORD]
    if len(files) != 1:
        raise SystemExit(f"{case}: expected one inventory file, found {[p.name for p in files]}")
    return files[0]


def record(case: Path, tool: str) -> dict:
    """Run ansible-inventory on the case (from inside its folder) and keep what tests compare."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "ANSIBLE_HOME": home, "ANSIBLE_LOCAL_TEMP": home,
               "ANSIBLE_DEPRECATION_WARNINGS": "false"}
        run = subprocess.run([tool, "-i", inventory_file(case).name, "--list"], cwd=case,
                             env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{case.name}: ansible-inventory failed:\n{run.stderr}")
        out = run.stdout
        version = subprocess.run([tool, "--version"], env=env, capture_output=True, text=True,
                                 check=True).stdout.splitlines()[0]
    data = json.loads(out)
    hostvars = data.pop("_meta")["hostvars"]
    return {"recorded_with": version, "hostvars": hostvars,
            "groups": {name: {"hosts": g.get("hosts", []), "children": g.get("children", [])}
                       for name, g in data.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ansible-inventory", default=shutil.which("ansible-inventory"))
    args = parser.parse_args()
    if not args.ansible_inventory:
        print("ansible-inventory not found: pip install ansible-core==2.19.0", file=sys.stderr)
        return 2
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        result = record(case, args.ansible_inventory)
        (case / RECORD).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"{case.name}: {len(result['hostvars'])} host(s), {result['recorded_with']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
