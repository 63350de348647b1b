"""Reading a large Ansible inventory (goal: 100,000 INI hosts read in < 5 s).

Usage: python scripts/bench_inventory.py [--hosts 10000,100000] [--repeat 3] [--load]

Writes an INI inventory per size (hosts spread over 20 groups, with `[group:vars]`,
`[group:children]` and `[all:vars]`), reads it with `config.ansible.read_inventory` (the built-in
reader: hosts, groups, every host's variables in Ansible's precedence, our format's data) in this
process, and reports the best wall and CPU time of the repeats, the time per host, and the ratio
of each size's time per host to the smallest's (1.0 is linear growth). `--load` also times
`config.load_inventory` (the reader plus the loader's validation into models).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_inventory  # noqa: E402
from orchestrator.config.ansible import read_inventory  # noqa: E402

GOAL_HOSTS, GOAL_S = 100_000, 5.0


def ini_inventory(n: int, groups: int = 20) -> str:
    """n hosts over `groups` groups, vars on a few groups and on all, children groups above."""
    lines: list[str] = []
    for g in range(groups):
        lines.append(f"[g{g}]")
        lines += [f"h{g}-{i}.lab ansible_host=10.{g}.{i // 256}.{i % 256} rack=r{i % 8}"
                  for i in range(n // groups)]
        if g % 5 == 0:
            lines += [f"[g{g}:vars]", f"sglang_port={30000 + g}"]
    for p in range(groups // 5):
        lines.append(f"[p{p}:children]")
        lines += [f"g{g}" for g in range(p * 5, p * 5 + 5)]
    lines += ["[all:vars]", "ansible_user=root"]
    return "\n".join(lines) + "\n"


def best_of(repeat: int, fn) -> tuple[float, float]:  # noqa: ANN001 - tiny helper
    wall = cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="10000,100000", help="sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many reads")
    parser.add_argument("--load", action="store_true", help="also time load_inventory")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.hosts.split(","))
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-inventory-") as tmp:
        base: float | None = None
        for n in sizes:
            path = Path(tmp) / f"hosts-{n}.ini"
            path.write_text(ini_inventory(n))

            def read(path: Path = path, n: int = n) -> None:
                doc, problems = read_inventory(path)
                assert not problems and doc is not None and len(doc.data["hosts"]) == n

            wall, cpu = best_of(args.repeat, read)
            per_host = wall / n
            base = base or per_host
            goal = ""
            if n == GOAL_HOSTS:
                goal = f"  (goal < {GOAL_S:.0f} s: {'met' if wall < GOAL_S else 'MISSED'})"
                failed = wall >= GOAL_S
            print(f"read_inventory {n:>7} hosts: {wall:6.2f} s wall, {cpu:6.2f} s CPU, "
                  f"{per_host * 1e6:5.1f} us/host, x{per_host / base:.2f} per host vs "
                  f"{sizes[0]}{goal}")
            if args.load:
                wall, cpu = best_of(1, lambda path=path: load_inventory(path))
                print(f"load_inventory {n:>7} hosts: {wall:6.2f} s wall, {cpu:6.2f} s CPU, "
                      f"{wall / n * 1e6:5.1f} us/host")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
