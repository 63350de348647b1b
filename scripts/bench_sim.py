"""Time and memory of starting the simulated hosts (goal: 16 GPU hosts in < 10 s, < 1 GiB).

Usage: python scripts/bench_sim.py [--hosts 16] [--sshd embedded|openssh] [--no-services]

Starts a simulator in a temporary directory, measures the wall time from the call until every
host answers SSH, then the resident memory (RSS) of the daemon and every process it started
(sshd listeners in openssh mode), runs one command per host through OpenSSH, and stops it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from orchestrator_sim import procs
from orchestrator_sim.fleet import SimFleet


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--sshd", choices=["embedded", "openssh"], default="embedded")
    parser.add_argument("--no-services", action="store_true",
                        help="without the package index and model hub")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        t0 = time.perf_counter()
        fleet = SimFleet.up(Path(tmp) / "sim", hosts=args.hosts, sshd=args.sshd,
                            index=not args.no_services, hub=not args.no_services)
        started = time.perf_counter() - t0
        try:
            info = fleet.info()
            daemon = int(info["pid"])
            pids = [daemon] + procs.descendants(daemon)
            total = sum(rss_kib(p) for p in pids)
            t1 = time.perf_counter()
            for h in info["hosts"]:
                res = fleet.ssh(h["name"], "nvidia-smi -L | wc -l")
                if res.returncode != 0:
                    print(f"{h['name']}: ssh failed: {res.stderr}", file=sys.stderr)
                    return 1
            per_cmd = (time.perf_counter() - t1) / len(info["hosts"])
        finally:
            fleet.down()
    endpoints = len(info["hosts"])
    print(f"hosts: {args.hosts} GPU hosts ({endpoints} SSH endpoints incl. hypervisors), "
          f"sshd={args.sshd}, services={'no' if args.no_services else 'index+hub'}")
    print(f"start time: {started:.2f} s (goal < 10 s)")
    print(f"memory: {total / 1024:.1f} MiB RSS in {len(pids)} process(es) (goal < 1024 MiB)")
    print(f"one OpenSSH command per host: {per_cmd * 1000:.0f} ms each")
    return 0 if started < 10 and total < 1024 * 1024 else 2


if __name__ == "__main__":
    sys.exit(main())
