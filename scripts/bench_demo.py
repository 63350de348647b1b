"""`make bench-demo`: autoregressive vs EAGLE-3 on a simulated 8-GPU host, a small tune, a report.

Brings up a time-scaled simulator in .sim/bench-demo, then runs the real CLI, as an operator
would: deploy the baseline playbook, bench it; deploy the EAGLE-3 playbook, bench it; tune over a
small grid (off, EAGLE3 steps 1 and 3 with topk 1, and a topk-4 tree). `report` covers the two
benches and the Gantt chart of the first deploy; tune writes its own report of the sweep. Prints
the tables, the tune result and the PNG paths, takes the simulator down, prints the wall time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIMDIR = REPO / ".sim" / "bench-demo"
RUNS = SIMDIR / "runs"
WORKLOAD = ["--concurrency", "1,2,4,8,16,32,64", "--input-len", "32", "--output-len", "256"]
GRID = """tune:
  baseline: true
  grid:
    num_steps: [1, 3]
    eagle_topk: [1]
  candidates:
    - {num_steps: 3, eagle_topk: 4, num_draft_tokens: 8}
"""


def cli(*args: str, quiet: bool = False) -> str:
    """Run `orchestrator ARGS`; stop the demo if it fails."""
    print(f"\n$ orchestrator {' '.join(args)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if not quiet or proc.returncode != 0:
        print(out.rstrip(), flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench-demo: `orchestrator {args[0]}` exited {proc.returncode}")
    return out


def run_id(out: str, prefix: str) -> str:
    """The run id printed on a line starting with `prefix`."""
    for line in out.splitlines():
        if line.startswith(prefix):
            return line.split()[1].rstrip(":")
    raise SystemExit(f"bench-demo: no `{prefix}` line in the output")


def main() -> int:
    t0 = time.monotonic()
    if (SIMDIR / "sim.json").exists():
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "sim", "down", "--dir",
                        str(SIMDIR)], cwd=REPO, capture_output=True)
    shutil.rmtree(SIMDIR, ignore_errors=True)
    cli("sim", "up", "--dir", str(SIMDIR), "--hosts", "1", "--time-scale", "0.01",
        "--load-seconds", "60")
    inv = str(SIMDIR / "inventory.yaml")
    common = ["-i", inv, "--run-dir", str(RUNS)]
    try:
        first = cli("deploy", "playbooks/kimi-k2.6-baseline.yaml", *common, quiet=True)
        deploy_run = run_id(first, "run ")
        base = run_id(cli("bench", "playbooks/kimi-k2.6-baseline.yaml", *common, *WORKLOAD),
                      "bench ")
        cli("deploy", "playbooks/kimi-k2.6-eagle3.yaml", *common, quiet=True)
        eagle = run_id(cli("bench", "playbooks/kimi-k2.6-eagle3.yaml", *common, *WORKLOAD),
                       "bench ")
        (SIMDIR / "grid.yaml").write_text(GRID)
        cli("report", str(RUNS / base), str(RUNS / eagle), str(RUNS / deploy_run), "-o",
            str(SIMDIR / "report"))
        cli("tune", "playbooks/kimi-k2.6-eagle3.yaml", *common, *WORKLOAD, "--grid",
            str(SIMDIR / "grid.yaml"), "--out", str(SIMDIR / "tune"))
        print("\n" + (SIMDIR / "tune" / "speculative-override.yaml").read_text().rstrip())
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "sim", "down", "--dir",
                        str(SIMDIR)], cwd=REPO, capture_output=True)
    print(f"\nbench-demo: {time.monotonic() - t0:.0f} s wall; reports "
          f"{SIMDIR / 'report' / 'report.md'} and {SIMDIR / 'tune' / 'report' / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
