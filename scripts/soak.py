"""`make soak`: many cycles of deploy -> reboot -> deploy on 4 flaky simulated hosts.

One simulator (`SimFleet`, 4 boxes: gpu-i + its hypervisor pve-i) with the `ssh-flaky` fault ON
for every box, so SSH sessions are cut at random all along. Each cycle:

  1. deploys playbooks/kimi-k2.6-eagle3.yaml on the 4 hosts (converged after the first cycle);
  2. power-cycles every box (`reboot`: SSH down, every process killed, the nvidia-uvm major
     re-rolled so CUDA init fails until the hypervisor fixes the container's cgroup);
  3. deploys again at once with a `--wait-for-host` long enough for the downtime.

Every deploy runs IN THIS PROCESS through the same library call as `orchestrator deploy`
(orchestrator.deploy.deploy, a run dir per deploy), so the orchestrator's own resident memory,
open file descriptors and threads can be measured across cycles. A cycle fails when either
deploy does not end with every host ready (exit code 0).

Pass/fail (exit 1 on any):
  * failures > 0;
  * leftovers > 0: after the final `fleet.down()`, any process still carrying this simulator's
    SIM_HOST_ID marker, a live simulator daemon, or a live child of this process;
  * open fds grow: the count after the last cycle is above the count after the warm-up cycle
    (fds are counted when no deploy runs: every connection is closed by then);
  * RSS grows: the least-squares slope of RSS over the second half of the cycles (after the
    warm-up: caches, imports and pools are full by then) is above --rss-slope-kib KiB per cycle
    (default 256 KiB, i.e. < 13 MiB over 50 cycles; a leak of one deploy's state - events,
    records, transports - is far above that). Judged from 10 cycles on: a shorter soak is
    still warming up (RSS rises ~6 MiB over the first ~20 cycles, then stays flat).
Also recorded per cycle: threads, and host processes on the simulated hosts (it must stay at
the steady count: one server tree per host, no stray agents).

    .venv/bin/python scripts/soak.py [--cycles 50] [--time-scale 0.002] [--flaky-rate 0.2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.deploy import deploy as run_deploy
from orchestrator.errors import OrchestratorError
from orchestrator.events import (
    EventHandler,
    HostLockRetaken,
    HostWaiting,
    StageCheckRetry,
    StageRetry,
)
from orchestrator.options import RunOptions
from orchestrator.redact import REDACTOR
from orchestrator.status import Status
from orchestrator.summary import RunSummary
from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.fleet import host_pids as marked_pids
from orchestrator_sim.procs import alive as pid_alive

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "playbooks" / "kimi-k2.6-eagle3.yaml"
#: fewer cycles than this are still warming up (the 50-cycle soak plateaus after ~20): the
#: RSS rule is reported but not judged
MIN_RSS_CYCLES = 10
#: runner events counted per deploy -> their names in the report
COUNTED = {"stage.retry": "retries", "stage.check_retry": "check_retries",
           "host.waiting": "waits", "host.lock_retaken": "lock_retakes",
           "transport.agent_retired": "agents_retired"}


# ------------------------------------------------------------------------------ measurements


def _status_field(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def rss_kib() -> int:
    """This process's resident set size (VmRSS) in KiB."""
    return _status_field("VmRSS")


def open_fds() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    """Threads of this process (the kernel's count, not only Python's)."""
    return _status_field("Threads")


def live_children(parent: int) -> list[int]:
    """Live processes whose parent is `parent`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = data.rsplit(b")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == parent and fields[0] not in (b"Z", b"X"):
            out.append(int(entry))
    return out


def server_trees(fleet: SimFleet) -> int:
    """Processes that belong to the servers the deploys started (one session per server)."""
    sessions = set()
    for h in fleet.info().get("hosts", []):
        if h.get("role") == "hypervisor":
            continue
        pidfile = Path(h.get("root", "")) / "opt" / "orchestrator" / "run" / "server.pid"
        try:
            pid = int(json.loads(pidfile.read_text())["pid"])
            sessions.add(os.getsid(pid))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    count = 0
    for pid in marked_pids(fleet.simdir):
        try:
            if os.getsid(pid) in sessions:
                count += 1
        except OSError:
            continue
    return count


def slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0..n-1 (0.0 for fewer than 2 points)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    my = sum(ys) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sxx


# ------------------------------------------------------------------------------ one deploy


@dataclass
class Deploy:
    """What one in-process deploy did."""

    exit_code: int
    seconds: float
    run_dir: str
    statuses: dict[str, dict[str, str]]
    counts: dict[str, int]  # the events of COUNTED, by their short names
    errors: list[str] = field(default_factory=list)

    @property
    def retries(self) -> int:
        return self.counts["retries"]

    @property
    def waits(self) -> int:
        return self.counts["waits"]


class _Counter(EventHandler):
    """Counts the events (and the log line) of COUNTED in one deploy."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COUNTED.values(), 0)

    def _count(self, name: str) -> None:
        if name in COUNTED:
            self.counts[COUNTED[name]] += 1

    def on_stage_retry(self, e: StageRetry) -> None:
        self._count(e.name)

    def on_stage_check_retry(self, e: StageCheckRetry) -> None:
        self._count(e.name)

    def on_host_waiting(self, e: HostWaiting) -> None:
        self._count(e.name)

    def on_host_lock_retaken(self, e: HostLockRetaken) -> None:
        self._count(e.name)

    def on_log(self, record: dict[str, Any]) -> None:
        self._count(str(record.get("event")))


def _latest_record(runs: Path) -> tuple[Path, RunSummary]:
    """The run dir and summary of the deploy that just raised (it wrote its record)."""
    run_dir = (runs / "latest").resolve()
    path = run_dir / "summary.json"
    return run_dir, RunSummary.read(path) if path.exists() else RunSummary("?", "?", "?")


def deploy(inventory: Path, runs: Path, wait_for_host: float) -> Deploy:
    """`orchestrator deploy PLAYBOOK -i INVENTORY --wait-for-host N --json`, in this process."""
    t0 = time.monotonic()
    counter = _Counter()
    crash: str | None = None
    try:
        outcome = run_deploy(PLAYBOOK, inventory, run_dir=runs, handlers=[counter],
                             options=RunOptions(wait_for_host=wait_for_host))
        exit_code, run_dir, summary = outcome.exit_code, outcome.run_dir, outcome.summary
    except OrchestratorError as exc:  # as the CLI maps it: one message, its exit code
        exit_code, crash = exc.exit_code, REDACTOR.redact(exc.render())
        run_dir, summary = _latest_record(runs)
    except Exception:  # noqa: BLE001 - a bug: the cycle fails, the soak goes on and reports it
        exit_code, crash = 1, REDACTOR.redact(traceback.format_exc())
        run_dir, summary = _latest_record(runs)
    counts = counter.counts
    statuses = {h: {sid: str(st.status) for sid, st in data.stages.items()}
                for h, data in summary.hosts.items()}
    errors = [crash] if crash else []
    for h, data in summary.hosts.items():
        if data.error:
            errors.append(f"{h}: {data.error.splitlines()[0]}")
        for sid, st in data.stages.items():
            if st.status == Status.FAILED:
                errors.append(f"{h}/{sid}: {(st.error or '').splitlines()[:3]}")
    return Deploy(exit_code, round(time.monotonic() - t0, 2), str(run_dir), statuses, counts,
                  errors)


# ------------------------------------------------------------------------------ the soak


@dataclass
class Cycle:
    """One deploy -> reboot -> deploy cycle and the orchestrator's footprint after it."""

    n: int
    ok: bool
    first: dict[str, Any]
    second: dict[str, Any]
    rss_kib: int
    fds: int
    threads: int
    host_procs: int
    stray_host_procs: int
    seconds: float


def run_soak(cycles: int = 50, time_scale: float = 0.002, hosts: int = 4,
             flaky_rate: float = 0.2, flaky_within: float = 2.0,
             wait_for_host: float | None = None, workdir: Path | None = None,
             rss_slope_kib: float = 256.0,
             say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the soak; return its report (pass/fail rules: `summarize`)."""
    t_start = time.monotonic()
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="soak-")) if workdir is None else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    simdir = work / "sim"
    runs = work / "runs"
    fleet = SimFleet.up(simdir, hosts=hosts, time_scale=time_scale)
    daemon_pid = fleet.info().get("pid")
    down_s = max(0.5, 300.0 * time_scale)  # the simulator's reboot downtime at this scale
    wait = wait_for_host if wait_for_host is not None else max(60.0, 20 * down_s)
    records: list[Cycle] = []
    gpus = [f"gpu-{i}" for i in range(1, hosts + 1)]
    try:
        for g in gpus:
            fleet.fault(g, "ssh-flaky", rate=flaky_rate, within=flaky_within)
        say(f"soak: {cycles} cycles of deploy -> reboot -> deploy on {hosts} hosts, ssh-flaky "
            f"rate {flaky_rate} within {flaky_within}s, time scale {time_scale} (reboot "
            f"{down_s:.1f}s down, --wait-for-host {wait:.0f}s); work dir {work}")
        for n in range(1, cycles + 1):
            t0 = time.monotonic()
            first = deploy(fleet.inventory_path, runs, wait)
            if first.exit_code == 130:
                raise KeyboardInterrupt("a deploy was interrupted")
            for g in gpus:
                fleet.fault(g, "reboot")
            second = deploy(fleet.inventory_path, runs, wait)
            if second.exit_code == 130:
                raise KeyboardInterrupt("a deploy was interrupted")  # Ctrl-C / kill: stop
            ok = first.exit_code == 0 and second.exit_code == 0
            marked = marked_pids(simdir)
            servers = server_trees(fleet)
            c = Cycle(n, ok, _brief(first), _brief(second), rss_kib(), open_fds(),
                      thread_count(), len(marked), len(marked) - servers,
                      round(time.monotonic() - t0, 2))
            records.append(c)
            say(f"cycle {n:3d}/{cycles} {'ok  ' if ok else 'FAIL'} "
                f"deploy {first.seconds:5.1f}s (exit {first.exit_code}, "
                f"{first.retries} retries) reboot+deploy {second.seconds:5.1f}s "
                f"(exit {second.exit_code}, {second.retries} retries, {second.waits} waits) "
                f"rss {c.rss_kib / 1024:6.1f} MiB fds {c.fds} threads {c.threads} "
                f"host procs {c.host_procs} (stray {c.stray_host_procs})")
            for d in (first, second):
                for e in d.errors:
                    say(f"    {e}")
    finally:
        fleet.down()
    leftovers = _leftovers(simdir, daemon_pid)
    report = summarize(records, leftovers, time.monotonic() - t_start, rss_slope_kib)
    report["config"] = {"cycles": cycles, "hosts": hosts, "time_scale": time_scale,
                        "flaky_rate": flaky_rate, "flaky_within": flaky_within,
                        "wait_for_host": wait, "reboot_down_s": down_s, "work": str(work)}
    report["cycles_detail"] = [asdict(c) for c in records]
    if own_dir and report["passed"]:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _brief(d: Deploy) -> dict[str, Any]:
    changed = sorted({sid for st in d.statuses.values() for sid, s in st.items()
                      if s == "changed"})
    return {"exit_code": d.exit_code, "seconds": d.seconds, **d.counts, "changed": changed,
            "errors": d.errors, "run_dir": d.run_dir}


def _leftovers(simdir: Path, daemon_pid: int | None) -> dict[str, list[int]]:
    deadline = time.monotonic() + 5
    while True:
        left = {
            "host_processes": marked_pids(simdir),
            "daemon": [daemon_pid] if daemon_pid and pid_alive(daemon_pid) else [],
            "children": live_children(os.getpid()),
        }
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def summarize(records: list[Cycle], leftovers: dict[str, list[int]], total_s: float,
              rss_slope_kib: float) -> dict[str, Any]:
    """Figures and the verdict from the per-cycle records."""
    n = len(records)
    failures = [c.n for c in records if not c.ok]
    rss = [c.rss_kib for c in records]
    fds = [c.fds for c in records]
    threads = [c.threads for c in records]
    stray = [c.stray_host_procs for c in records]
    warm = 1 if n >= 2 else 0  # the first cycle fills the caches (imports, agent sources...)
    second_half = rss[n // 2:] if n >= 4 else rss[warm:]
    rss_slope = slope([float(x) for x in second_half])
    fd_growth = (fds[-1] - fds[warm]) if n else 0
    n_left = sum(len(v) for v in leftovers.values())
    reasons = []
    if failures:
        reasons.append(f"{len(failures)} failed cycle(s): {failures}")
    if n_left:
        reasons.append(f"{n_left} leftover process(es): {leftovers}")
    if fd_growth > 0:
        reasons.append(f"open fds grew by {fd_growth} after the warm-up ({fds[warm]} -> "
                       f"{fds[-1]})")
    rss_judged = n >= MIN_RSS_CYCLES
    if rss_judged and rss_slope > rss_slope_kib:
        reasons.append(f"RSS grows {rss_slope:.0f} KiB per cycle over the second half "
                       f"(limit {rss_slope_kib:.0f})")
    if n and stray[-1] > 0:
        reasons.append(f"{stray[-1]} stray process(es) on the simulated hosts after the last "
                       "cycle (beyond the servers)")
    return {
        "cycles": n,
        "failures": len(failures),
        "failed_cycles": failures,
        "rss_mib": {"first": _mib(rss[0]) if n else None, "last": _mib(rss[-1]) if n else None,
                    "max": _mib(max(rss)) if n else None,
                    "growth": _mib(rss[-1] - rss[0]) if n else None,
                    "slope_kib_per_cycle_second_half": round(rss_slope, 1),
                    "limit_kib_per_cycle": rss_slope_kib, "judged": rss_judged},
        "fds": {"first": fds[0] if n else None, "after_warmup": fds[warm] if n else None,
                "last": fds[-1] if n else None, "max": max(fds) if n else None,
                "growth_after_warmup": fd_growth},
        "threads": {"first": threads[0] if n else None, "last": threads[-1] if n else None,
                    "max": max(threads) if n else None},
        "stray_host_procs": {"max": max(stray) if n else None,
                             "last": stray[-1] if n else None},
        **{name: sum(c.first.get(name, 0) + c.second.get(name, 0) for c in records)
           for name in COUNTED.values()},
        "leftovers": n_left,
        "leftover_pids": leftovers,
        "total_s": round(total_s, 1),
        "passed": not reasons,
        "reasons": reasons,
    }


def _mib(kib: float) -> float:
    return round(kib / 1024, 1)


def render(report: dict[str, Any]) -> str:
    """The human summary printed at the end."""
    r, f, t = report["rss_mib"], report["fds"], report["threads"]
    cfg = report.get("config", {})
    lines = [
        "",
        "== soak report",
        f"cycles        {report['cycles']} (deploy -> reboot -> deploy on {cfg.get('hosts')} "
        f"hosts, ssh-flaky rate {cfg.get('flaky_rate')}, time scale {cfg.get('time_scale')})",
        f"failures      {report['failures']} {report['failed_cycles'] or ''}".rstrip(),
        f"retries       {report['retries']} stage retries, {report['check_retries']} checks "
        f"asked again after a cut, {report['waits']} waits for a host (sessions cut by "
        f"ssh-flaky, reboots), {report['lock_retakes']} host locks re-taken on a re-opened "
        f"connection, {report['agents_retired']} agents of dropped connections ended",
        f"RSS           first {r['first']} MiB, last {r['last']} MiB, max {r['max']} MiB, "
        f"growth {r['growth']} MiB; second half {r['slope_kib_per_cycle_second_half']} "
        f"KiB/cycle (limit {r['limit_kib_per_cycle']:.0f}"
        + ("" if r["judged"] else f"; not judged under {MIN_RSS_CYCLES} cycles") + ")",
        f"open fds      first {f['first']}, after warm-up {f['after_warmup']}, last "
        f"{f['last']}, max {f['max']}",
        f"threads       first {t['first']}, last {t['last']}, max {t['max']}",
        f"stray host    max {report['stray_host_procs']['max']}, last "
        f"{report['stray_host_procs']['last']} (host processes beyond the servers)",
        f"leftovers     {report['leftovers']} after sim down",
        f"total time    {report['total_s']}s",
        "PASSED" if report["passed"] else "FAILED: " + "; ".join(report["reasons"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the soak, print the report; exit 1 unless it passed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=0.002,
                    help="simulated time scale (0.002: the 960 s load takes ~2 s)")
    ap.add_argument("--flaky-rate", type=float, default=0.2,
                    help="ssh-flaky: probability that a session is cut (default 0.2)")
    ap.add_argument("--flaky-within", type=float, default=2.0,
                    help="ssh-flaky: a cut session dies within this many seconds")
    ap.add_argument("--wait-for-host", type=float, default=None,
                    help="seconds a deploy waits for SSH (default: 20x the reboot downtime, "
                         "at least 60)")
    ap.add_argument("--rss-slope-kib", type=float, default=256.0,
                    help="most RSS growth per cycle (second half, linear fit) that passes")
    ap.add_argument("--dir", type=Path, default=None,
                    help="work directory (default: a temp dir, removed when the soak passes)")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if args.cycles < 1:
        ap.error("--cycles must be at least 1")
    report = run_soak(cycles=args.cycles, time_scale=args.time_scale, hosts=args.hosts,
                      flaky_rate=args.flaky_rate, flaky_within=args.flaky_within,
                      wait_for_host=args.wait_for_host, workdir=args.dir,
                      rss_slope_kib=args.rss_slope_kib,
                      say=lambda s: print(s, flush=True))
    print(render(report), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0 if report["passed"] else 1


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    threading.current_thread().name = "soak"
    # started in the background SIGINT may be ignored: Ctrl-C and `kill PID` both stop the
    # deploy in progress cleanly and take the simulator down (no report)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
