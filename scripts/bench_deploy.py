"""Benchmark the K2.6 + EAGLE-3 deploy against a simulated host: first deploy on a box as found,
converged re-run, per-stage check times, and how fast a server that dies while loading is
reported. Figures from one run, printed with their ratios.

    python scripts/bench_deploy.py [--time-scale 0.005]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.status import Status
from orchestrator.summary import RunSummary
from orchestrator_sim.fleet import SimFleet

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")


def deploy(inv: Path, runs: Path, *extra: str) -> tuple[float, RunSummary]:
    env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(runs)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator", "deploy", PLAYBOOK, "-i", str(inv),
                        "--json", *extra], capture_output=True, text=True, env=env)
    took = time.monotonic() - t0
    if not p.stdout.strip():
        raise SystemExit(f"deploy printed no summary:\n{p.stderr}")
    return took, RunSummary.from_json(json.loads(p.stdout))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=0.005)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    fleet = SimFleet.up(work / "sim", hosts=1, time_scale=args.time_scale)
    try:
        subprocess.run([sys.executable, str(REPO / "scripts/sim_as_found.py"), str(fleet.simdir)],
                       check=True, capture_output=True)
        inv = Path(fleet.inventory_path)
        first, s1 = deploy(inv, work / "runs")
        second, s2 = deploy(inv, work / "runs")
        assert s1.exit_code == 0 and s2.exit_code == 0, (s1, s2)
        stages = s2.hosts["gpu-1"].stages
        assert {st.status for st in stages.values()} == {Status.OK}, stages
        print(f"time scale {args.time_scale} (simulated load {960 * args.time_scale:.1f}s)")
        print(f"first deploy (box as found)     {first:7.2f}s")
        print(f"converged re-run (all ok)       {second:7.2f}s   ratio {second / first:.3f}")
        print("per-stage check on the converged host:")
        for sid, st in stages.items():
            print(f"  {sid:<10} {st.duration_s if st.check_s is None else st.check_s:6.3f}s")

        # a server that dies while loading: break CUDA, stop the server, deploy without health
        fleet.fault("gpu-1", "uvm-cgroup")
        subprocess.run([sys.executable, "-m", "orchestrator", "stop", "-i", str(inv),
                        "--limit", "gpu"], capture_output=True, check=True)
        took, s3 = deploy(inv, work / "runs", "--skip", "health")
        ends = [st for st in s3.hosts["gpu-1"].stages.values() if st.status == Status.FAILED]
        print(f"server dying while loading: deploy failed after {took:.2f}s "
              f"(wait_ready timeout 30 min; ratio {took / 1800:.5f})" if ends else
              "server dying while loading: NOT detected")
    finally:
        fleet.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
