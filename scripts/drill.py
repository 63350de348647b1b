"""`make drill`: a reboot-recovery drill against a fresh simulated 8-GPU box.

  1. start a simulated RTX PRO 6000 x8 LXC host (with its Proxmox hypervisor, model hub and
     package index) in a fresh directory, and make it look like the user's box
     (scripts/sim_as_found.py);
  2. deploy Kimi K2.6 + EAGLE-3 (playbooks/kimi-k2.6-eagle3.yaml) until it is ready;
  3. power-cycle the box (the simulator's `reboot` fault: SSH down, every process killed, the
     nvidia-uvm major re-rolled so CUDA init fails until the hypervisor fixes the cgroup);
  4. run the SAME deploy at once with --wait-for-host: it waits for SSH, repairs what the reboot
     broke and proves the server serves again;
  5. verify with `orchestrator status` and print the recovery time (SSH back -> ready), the
     total time of the recovery deploy, and which stages changed and which were already ok;
  6. print the engine's load phases (from its own log: weights, KV pool, CUDA-graph capture,
     first ready) of the first deploy (cold kernel caches) beside the recovery's (warm), and
     the orchestrator's own overhead (the recovery deploy's time minus the engine's).

With `--nodes 2` the drill runs playbooks/kimi-k2.6-eagle3-2node.yaml over two boxes (TP 16:
node 0 = gpu-1 serves the API, node 1 = gpu-2 a dummy /health) and reboots `--reboot` (gpu-1 by
default): the other box's rank ends with it, and the recovery deploy launches both again.

The simulated box is always stopped at the end. Exit 0 when the recovery reached ready, else 1.

    .venv/bin/python scripts/drill.py [--dir .sim/drill] [--down-seconds 5] [--time-scale 0.005]
                                      [--nodes 2 [--reboot gpu-2]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "playbooks" / "kimi-k2.6-eagle3.yaml"
PLAYBOOK_2NODE = REPO / "playbooks" / "kimi-k2.6-eagle3-2node.yaml"
BROKEN_BY_REBOOT = ("health", "server", "ready")


def parse_ts(ts: str) -> float:
    """Event timestamp (ISO 8601 UTC with 'Z') -> epoch seconds."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


class SSHWatch:
    """Polls a host's SSH port from the moment the box goes down; notes when SSH answers again."""

    def __init__(self, address: str, port: int, interval: float = 0.05) -> None:
        self.address, self.port, self.interval = address, port, interval
        self.back_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ssh-watch", daemon=True)

    def start(self) -> SSHWatch:
        self._thread.start()
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection((self.address, self.port), timeout=0.5) as s:
                s.settimeout(1.0)
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._answers():
                self.back_at = time.time()
                return
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def orchestrator(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """The real CLI; its console goes to this terminal unless captured."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=str(REPO),
                          capture_output=capture, text=True)


def latest_run(runs: Path) -> Path:
    link = runs / "latest"
    if not link.exists():
        raise SystemExit(f"drill: the deploy wrote no run record under {runs}")
    return link.resolve()


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
            if line.strip()]


def recovery_report(run_dir: Path, host: str, reboot_at: float, ssh_back: float | None,
                    wall_s: float) -> tuple[bool, list[str]]:
    """(reached ready, lines to print) from the recovery deploy's record."""
    summary = json.loads((run_dir / "summary.json").read_text())
    events = read_events(run_dir)
    stages = summary["hosts"].get(host, {}).get("stages", {})
    statuses = {sid: st.get("status") for sid, st in stages.items()}
    waits = [e for e in events if e["event"] == "host.waiting" and e.get("host") == host]
    connected = next((parse_ts(e["ts"]) for e in events
                      if e["event"] == "host.connected" and e.get("host") == host), None)
    ready_end = next((e for e in events if e["event"] == "stage.end"
                      and e.get("host") == host and e.get("stage") == "ready"), None)
    ready = (summary.get("exit_code") == 0 and ready_end is not None
             and ready_end.get("status") in ("changed", "ok"))
    lines = []
    if ssh_back is None and waits and connected is not None:
        ssh_back = connected  # the watch missed it: the first connect after waiting
    if ssh_back is not None:
        lines.append(f"SSH back:         {ssh_back - reboot_at:6.1f}s after the reboot")
    if connected is not None:
        how = (f"after {len(waits)} wait(s) for SSH" if waits
               else "at once (SSH was already back)")
        lag = f", {connected - ssh_back:.1f}s after SSH was back" if ssh_back and waits else ""
        lines.append(f"deploy connected: {connected - reboot_at:6.1f}s after the reboot, "
                     f"{how}{lag}")
    if ready_end is not None and not ready:
        lines.append(f"ready:            NOT reached (ready stage {ready_end.get('status')})")
    elif ready_end is not None:
        ready_at = parse_ts(ready_end["ts"])
        lines.append(f"ready:            {ready_at - reboot_at:6.1f}s after the reboot "
                     f"(ready stage {ready_end.get('status')})")
        if ssh_back is not None:
            lines.append(f"RECOVERY TIME (SSH back -> ready): {ready_at - ssh_back:.1f}s")
    started = next((parse_ts(e["ts"]) for e in events if e["event"] == "run.start"), None)
    waited = (f", {connected - started:.1f}s of it waiting for SSH"
              if waits and connected is not None and started is not None else "")
    lines.append(f"recovery deploy:  {summary.get('duration_s', 0.0):.1f}s in total{waited} "
                 f"({wall_s:.1f}s with the CLI's start-up), exit code "
                 f"{summary.get('exit_code')}")
    by_status: dict[str, list[str]] = {}
    for sid, status in statuses.items():
        by_status.setdefault(str(status), []).append(sid)
    for status in ("changed", "ok", "failed", "skipped"):
        if by_status.get(status):
            lines.append(f"stages {status + ':':<9} {', '.join(by_status[status])}")
    unexpected = [s for s in by_status.get("changed", []) if s not in BROKEN_BY_REBOOT]
    if unexpected:
        lines.append(f"note: the recovery also redid {', '.join(unexpected)} "
                     "(a reboot should only break health, server and ready)")
    fix = (summary["hosts"].get(host, {}).get("facts") or {}).get("health", {}).get("uvm_fix")
    if fix:
        lines.append(f"uvm fix:          {json.dumps(fix, default=str)[:300]}")
    return ready, lines


def load_timeline(run_dir: Path, host: str) -> dict[str, dict[str, Any]]:
    """The server's load phases, as wait_ready recorded them (fact "load_timeline")."""
    summary = json.loads((run_dir / "summary.json").read_text())
    facts = (summary["hosts"].get(host, {}).get("facts") or {}).get("ready") or {}
    return {p["phase"]: p for p in facts.get("load_timeline") or []}


def phase_table(first: Path, recovery: Path, host: str, scale: float) -> list[str]:
    """The engine's phases of the first load (cold kernel caches) beside the recovery's (warm),
    in nominal seconds (what the real box would take), and the orchestrator's own time."""
    cold, warm = load_timeline(first, host), load_timeline(recovery, host)
    lines = [f"{'load phase':<20} {'first deploy':>13} {'recovery':>10}  (nominal s)"]
    for name in dict.fromkeys([*cold, *warm]):
        cells = [f"{(t[name]['end'] - t[name]['start']) / scale:13.1f}" if name in t else
                 f"{'-':>13}" for t in (cold, warm)]
        lines.append(f"{name:<20} {cells[0]} {cells[1]:>10}")
    if warm:
        engine = max(p["end"] for p in warm.values()) - min(p["start"] for p in warm.values())
        events = read_events(recovery)
        connected = next((parse_ts(e["ts"]) for e in events
                          if e["event"] == "host.connected" and e.get("host") == host), None)
        end = next((parse_ts(e["ts"]) for e in events if e["event"] == "stage.end"
                    and e.get("host") == host and e.get("stage") == "ready"), None)
        if connected is not None and end is not None:
            lines.append(f"orchestrator overhead: {end - connected - engine:.2f}s (connected -> "
                         f"ready stage done, minus the engine's own {engine:.2f}s; real s)")
    capture = [t.get("cuda graph capture", {}).get("detail") for t in (cold, warm)]
    lines.append(f"kernel caches:    cuda graph capture {capture[0]} cold -> {capture[1]} warm "
                 "(nominal; the caches beside the venv survived the reboot)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=os.environ.get("SIM_DIR", str(REPO / ".sim" / "drill")),
                   help="simulator directory, emptied first (default .sim/drill or $SIM_DIR)")
    p.add_argument("--time-scale", type=float, default=0.005,
                   help="simulated durations x this (the 960 s load takes 4.8 s by default)")
    p.add_argument("--down-seconds", type=float, default=5.0,
                   help="how long the box stays down (SSH refused) after the reboot")
    p.add_argument("--wait-for-host", default="5m",
                   help="the recovery deploy's --wait-for-host (default 5m)")
    p.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                   help="2: one model over two boxes (multi-node TP 16)")
    p.add_argument("--reboot", default="gpu-1", help="the box to power-cycle (default gpu-1)")
    args = p.parse_args(argv)
    if args.reboot not in [f"gpu-{i + 1}" for i in range(args.nodes)]:
        p.error(f"--reboot {args.reboot}: the drill has gpu-1..gpu-{args.nodes}")
    playbook = PLAYBOOK_2NODE if args.nodes > 1 else PLAYBOOK

    sys.path.insert(0, str(REPO))
    from orchestrator_sim.fleet import SimFleet

    simdir = Path(args.dir).resolve()
    host = args.reboot
    SimFleet(simdir).down()  # a leftover from an interrupted drill
    shutil.rmtree(simdir, ignore_errors=True)
    runs = simdir / "runs"
    t_start = time.monotonic()
    banner(f"start a simulated box in {simdir} (time scale {args.time_scale})")
    fleet = SimFleet.up(simdir, hosts=args.nodes, time_scale=args.time_scale)
    watch: SSHWatch | None = None
    try:
        inventory = str(fleet.inventory_path)
        deploy = ["deploy", str(playbook), "-i", inventory, "--run-dir", str(runs)]
        as_found = max(subprocess.run([sys.executable, str(REPO / "scripts" / "sim_as_found.py"),
                                       str(simdir), f"gpu-{i + 1}"], cwd=str(REPO)).returncode
                       for i in range(args.nodes))
        if as_found != 0:
            print("drill: could not prepare the simulated box", file=sys.stderr)
            return 1

        banner(f"deploy {playbook.relative_to(REPO)}")
        first = orchestrator(*deploy)
        if first.returncode != 0:
            print(f"drill: the first deploy failed (exit {first.returncode}); no drill",
                  file=sys.stderr)
            return 1
        first_run = latest_run(runs)

        banner(f"reboot {host}: down for {args.down_seconds:g}s")
        info = fleet.host(host)
        fault = fleet.fault(host, "reboot", down_seconds=args.down_seconds, wait=False)
        reboot_at = time.time()
        watch = SSHWatch(info["address"], int(info["port"])).start()
        print(f"{host}: powered off; every process killed; nvidia-uvm major is now "
              f"{fault['uvm_major']} (the container's cgroup still allows the old one)")

        banner(f"deploy again, --wait-for-host {args.wait_for_host}")
        t0 = time.monotonic()
        second = orchestrator(*deploy, "--wait-for-host", args.wait_for_host)
        wall = time.monotonic() - t0
        watch.stop()
        run_dir = latest_run(runs)

        banner("status")
        status = orchestrator("status", "-i", inventory, "--limit", "gpu", "--json",
                              capture=True)
        rows = json.loads(status.stdout) if status.returncode == 0 and status.stdout else []
        for row in rows:
            print(f"{row.get('host')}: {row.get('state')}, pid {row.get('pid')}, ready "
                  f"{row.get('ready')}, model {row.get('model')}, "
                  f"{row.get('speculative_algorithm')} accept length {row.get('accept_length')}")
        if status.returncode != 0:
            print(status.stderr.strip(), file=sys.stderr)
        serving = any(r.get("host") == "gpu-1" and r.get("ready") for r in rows)  # node 0

        ready, lines = recovery_report(run_dir, host, reboot_at, watch.back_at, wall)
        banner(f"recovery drill: {host}")
        for line in lines + phase_table(first_run, run_dir, "gpu-1", args.time_scale):
            print(line)
        others = json.loads((run_dir / "summary.json").read_text())["hosts"]
        for name in sorted(set(others) - {host}):  # multi-node: the rank that ended with it
            st = {k: v.get("status") for k, v in others[name]["stages"].items()}
            print(f"{name}:            server {st.get('server')}, ready {st.get('ready')}")
        print(f"run record:       {run_dir}/summary.json")
        ok = second.returncode == 0 and ready and serving
        print(f"drill {'PASSED' if ok else 'FAILED'}: the recovery "
              f"{'reached ready' if ok else 'did NOT reach ready'} "
              f"(whole drill {time.monotonic() - t_start:.1f}s)")
        return 0 if ok else 1
    finally:
        if watch is not None:
            watch.stop()
        fleet.down()
        print(f"simulated box in {simdir} stopped")


if __name__ == "__main__":
    raise SystemExit(main())
