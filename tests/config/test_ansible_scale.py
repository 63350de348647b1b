"""Reading an Ansible inventory grows linearly with its hosts.

Timing goals belong in `make bench` (scripts/bench_inventory.py reads 10,000 and 100,000 hosts);
here the growth itself is checked, two ways that do not depend on how fast or busy the machine is:

- the work counted: every function call (Python and C, `sys.setprofile`) made while reading n
  and 4n hosts; per host it is the same, so 4n hosts cost 4 times the calls (a scan of every
  value per value, as `val_at` once did for YAML, makes it 16);
- the CPU time (`time.process_time`, which other processes do not add to) of 2,000 and 32,000
  hosts, the best of three: linear is 16 times, quadratic 256; the bound, 40, leaves room for a
  busy machine's caches. A scan that the calls do not see (`name in list`, as `add_host` once did
  for the hosts of a group: 89 to 101 times here, 17 to 22 now, measured on a loaded 2-core
  machine) shows with all hosts in one group.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.config.ansible import read_inventory
from tests.e2e.scripts import load_script

BENCH = load_script("bench_inventory")


def ini_spread(n: int) -> str:
    """n hosts over 20 groups, vars on a few groups and on all, children groups above them
    (the inventory `make bench` reads at 10k and 100k hosts)."""
    return BENCH.ini_inventory(n)


def ini_one_group(n: int) -> str:
    return "[gpu]\n" + "".join(f"gpu-{i} rack='r{i % 8}'\n" for i in range(n))


def ini_many_groups(n: int) -> str:
    """A group per 2 hosts, none with a parent: `all` has n/2 children."""
    return "".join(f"[g{g}]\nh{g}-a\nh{g}-b\n" for g in range(n // 2))


def yaml_spread(n: int) -> str:
    out = ["all:", "  vars: {ansible_user: root}", "  children:"]
    for g in range(10):
        out += [f"    g{g}:", "      vars: {sglang_port: 30000}", "      hosts:"]
        out += [f"        h{g}-{i}: {{ansible_host: 10.0.{g}.{i % 256}, tags: [a, b]}}"
                for i in range(n // 10)]
    return "\n".join(out) + "\n"


CASES: dict[str, tuple[Callable[[int], str], str]] = {
    "ini-spread": (ini_spread, "hosts.ini"),
    "ini-one-group": (ini_one_group, "hosts.ini"),
    "ini-many-groups": (ini_many_groups, "hosts.ini"),
    "yaml-spread": (yaml_spread, "hosts.yaml"),
}


def write(tmp_path: Path, case: str, n: int) -> Path:
    make, name = CASES[case]
    folder = tmp_path / f"{case}-{n}"
    folder.mkdir()
    path = folder / name
    path.write_text(make(n))
    return path


def read_ok(path: Path, n: int) -> None:
    doc, problems = read_inventory(path)
    assert problems == [] and doc is not None and len(doc.data["hosts"]) == n


def calls(path: Path, n: int) -> int:
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        doc, problems = read_inventory(path)
    finally:
        sys.setprofile(None)
    assert problems == [] and doc is not None and len(doc.data["hosts"]) == n
    return count


@pytest.mark.parametrize("case", sorted(CASES))
def test_calls_grow_linearly_with_hosts(tmp_path: Path, case: str) -> None:
    small, large = calls(write(tmp_path, case, 500), 500), calls(write(tmp_path, case, 2000), 2000)
    assert large / small < 4.2, (small, large)


def cpu_seconds(path: Path, n: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        read_ok(path, n)
        best = min(best, time.process_time() - start)
    return best


def test_cpu_time_grows_linearly_with_hosts(tmp_path: Path) -> None:
    small = cpu_seconds(write(tmp_path, "ini-one-group", 2000), 2000)
    large = cpu_seconds(write(tmp_path, "ini-one-group", 32000), 32000)
    assert large / small < 40, f"2,000 hosts: {small:.3f} s, 32,000: {large:.3f} s"
