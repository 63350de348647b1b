"""The fault matrix (`make faults`): every fault the simulated host can inject, and a few more,
against a converged K2.6 + EAGLE-3 deploy; what the tool did, how fast, and what it left behind.

    python scripts/faults.py [--fast] [--only NAME ...] [--jobs N] [--keep] [--json FILE]

A simulated fleet is started (one box per job: a GPU container and its Proxmox hypervisor, the
shared model hub and package index) and the playbook is deployed once on every box. Each row then
takes a converged box, injects its fault, runs the deploy command again (or the action the row
describes) and records:

* expected: recovered and ready, or failed with a named message and exit code;
* outcome: what the tool did (exit code, the stage that failed and its message, or what changed);
* detect: seconds from the injection (or the start of the deploy, when the fault was there
  before it) to the moment the tool reported the failure or the recovery, from the events.jsonl
  timestamps of the run;
* leftovers: no process of the host left (a /proc scan for the simulator's SIM_HOST_ID marker
  of the host and of its hypervisor, the expected SGLang server's process group excepted), no
  temp file (`.*.tmp`) under the host's base_dir or the hypervisor's /etc/pve, every download
  manifest consistent with the files, the lxc config backup present when the config was edited,
  the run record complete (summary.json with finished_at and exit_code, events.jsonl ending
  with run.end).

Then the fault is switched off and the same deploy must converge again (exit 0), which also
leaves the box converged for the next row. The hub faults act on the one hub every box shares,
so those rows run alone. Exit status: 0 when every row passes, 1 otherwise.

Rows (ROWS below): every fault of sim/orchestrator_sim/faults.py; a shell stage whose command hangs
past its `timeout:`; the server killed while it loads and after it is ready; write_file of a
48 MiB file while the simulator cuts every SSH session; Ctrl-C (SIGINT to the orchestrator
process) while each stage of the playbook runs. `--fast` picks the rows that
`tests/e2e/test_fault_matrix.py` runs through `run_matrix()` (one box, about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python scripts/faults.py` from anywhere
    sys.path.insert(0, str(REPO))

from orchestrator.config import load_inventory  # noqa: E402
from orchestrator.errors import OrchestratorError  # noqa: E402
from orchestrator.host import Host  # noqa: E402
from orchestrator.transports import make_transport  # noqa: E402
from orchestrator_sim import procs  # noqa: E402
from orchestrator_sim.fleet import SimError, SimFleet, dir_hash  # noqa: E402

PLAYBOOK = REPO / "playbooks" / "kimi-k2.6-eagle3.yaml"
PROFILE = yaml.safe_load((REPO / "configs" / "models" / "kimi-k2.6.yaml").read_text())
SCALE = 0.001  # the nominal 960 s load takes ~1 s
#: a load long enough to act while wait_ready waits (nominal seconds; x SCALE = real seconds)
SLOW_LOAD = 8000
DEPLOY_TIMEOUT = 300.0
STAGES = ("health", "venv", "packages", "target", "drafter", "inspect", "server", "ready")


def parse_ts(ts: str) -> float:
    """Event timestamp (ISO 8601, UTC, 'Z') -> epoch seconds."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, pgrp, sid, ...)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def short(text: str, n: int) -> str:
    """One line, at most n characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "~"


# ---------------------------------------------------------------------------- a deploy run


class Run:
    """The real CLI running in a subprocess, with its own run-record directory."""

    def __init__(self, argv: list[str], runs: Path, log: Path,
                 stage_ids: tuple[str, ...] = STAGES) -> None:
        self.argv = argv
        self.stage_ids = stage_ids
        self.runs = runs
        self.log = log
        runs.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self._out = open(log, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *argv], stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "ORCHESTRATOR_RUN_DIR": str(runs)}, cwd=str(REPO))
        self.code: int | None = None
        self.ended: float | None = None

    def wait(self, timeout: float = DEPLOY_TIMEOUT) -> int:
        if self.code is not None:
            return self.code
        try:
            self.code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.code = self.proc.wait(timeout=10)
            self._out.write(f"\n[faults.py: killed after {timeout:.0f}s]\n")
        finally:
            self.ended = self.ended or time.time()
            self._out.close()
        return self.code

    def sigint(self) -> float:
        """Ctrl-C: SIGINT to the orchestrator process (it starts no local processes)."""
        os.kill(self.proc.pid, signal.SIGINT)
        return time.time()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def run_dir(self) -> Path | None:
        dirs = [p for p in self.runs.iterdir()
                if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]
        return dirs[0] if len(dirs) == 1 else None

    def events(self) -> list[dict[str, Any]]:
        d = self.run_dir
        if d is None or not (d / "events.jsonl").exists():
            return []
        out = []
        for line in (d / "events.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def summary(self) -> dict[str, Any]:
        d = self.run_dir
        if d is None:
            return {}
        try:
            return json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            return {}

    def stages(self, host: str) -> dict[str, dict[str, Any]]:
        return (self.summary().get("hosts", {}).get(host) or {}).get("stages") or {}

    def statuses(self, host: str) -> dict[str, str]:
        return {k: v.get("status", "?") for k, v in self.stages(host).items()}

    def facts(self, host: str) -> dict[str, Any]:
        return (self.summary().get("hosts", {}).get(host) or {}).get("facts") or {}

    def event(self, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        return next((e for e in self.events() if pred(e)), None)

    def wait_event(self, pred: Callable[[dict[str, Any]], bool], what: str,
                   timeout: float = 120.0) -> dict[str, Any]:
        """Poll events.jsonl until an event matches; AssertionError if the run ends first."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.event(pred)
            if found is not None:
                return found
            if self.proc.poll() is not None:
                found = self.event(pred)
                if found is not None:
                    return found
                raise AssertionError(f"the deploy ended (exit {self.proc.returncode}) before "
                                     f"{what}: {short(self.output[-600:], 600)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout:.0f}s")
            time.sleep(0.005)


def stage_is(event: str, stage: str, host: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("event") == event and e.get("stage") == stage and e.get("host") == host


# ---------------------------------------------------------------------------- one row


@dataclass
class RowResult:
    """What one row expected, what happened, and whether anything was left behind."""

    fault: str
    expected: str
    outcome: str = ""
    detect_s: float | None = None
    leftovers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    box: str = ""

    @property
    def passed(self) -> bool:
        return not self.problems and not self.leftovers

    def expect(self, ok: bool, message: str) -> bool:
        if not ok:
            self.problems.append(message)
        return ok

    def as_dict(self) -> dict[str, Any]:
        return {"fault": self.fault, "expected": self.expected, "outcome": self.outcome,
                "detect_s": self.detect_s, "leftovers": self.leftovers,
                "problems": self.problems, "notes": self.notes, "passed": self.passed,
                "seconds": round(self.seconds, 2), "box": self.box}


@dataclass
class Row:
    """A fault of the matrix: its name, what must happen, and the code that provokes it."""

    name: str
    expected: str
    fn: Callable[[Lab, RowResult], None]
    fast: bool = False
    alone: bool = False  # acts on something every box shares (the hub): nothing else runs


# ---------------------------------------------------------------------------- one box


class Lab:
    """One converged simulated box of the fleet, and the deploys/checks the rows use."""

    def __init__(self, fleet: SimFleet, host: str, work: Path) -> None:
        self.fleet = fleet
        self.host = host
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.data = yaml.safe_load(fleet.inventory_path.read_text())
        spec = self.data["hosts"][host]
        self.hv = spec["hypervisor"]["host"]
        self.ctid = int(spec["hypervisor"]["ctid"])
        self.vars = spec["vars"]
        self.base_dir = Path(self.vars["base_dir"])
        self.hv_root = Path(self.data["hosts"][self.hv]["vars"]["sim_root"])
        self.state_dir = self.base_dir / "run"
        self.venv = self.base_dir / "venvs" / f"sglang-{PROFILE['sglang_version']}"
        models = self.base_dir / "models"
        self.target_dir = models / PROFILE["target"]["repo"].replace("/", "--")
        self.drafter_dir = models / PROFILE["drafter"]["repo"].replace("/", "--")
        self._n = 0
        self._hash = dir_hash(fleet.simdir)
        self.runs: list[Run] = []  # the deploys of the current row

    # -- commands -------------------------------------------------------------------------------
    def _next(self, tag: str) -> tuple[Path, Path]:
        self._n += 1
        base = self.work / f"{self._n:03d}-{tag}"
        return base / "runs", base.with_suffix(".log")

    def inventory(self, overrides: dict[str, Any] | None = None) -> Path:
        if not overrides:
            return self.fleet.inventory_path
        data = copy.deepcopy(self.data)
        data["hosts"][self.host]["vars"].update(overrides)
        self._n += 1
        path = self.work / f"inv-{self._n:03d}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def start(self, *args: str, playbook: Path = PLAYBOOK,
              overrides: dict[str, Any] | None = None, tag: str = "deploy") -> Run:
        inv = self.inventory(overrides)
        runs, log = self._next(tag)
        stage_ids = STAGES if playbook == PLAYBOOK else tuple(
            st["id"] for st in yaml.safe_load(playbook.read_text())["stages"])
        run = Run(["deploy", str(playbook), "-i", str(inv), "--limit", self.host, *args],
                  runs, log, stage_ids)
        self.runs.append(run)
        return run

    def deploy(self, *args: str, **kw: Any) -> Run:
        run = self.start(*args, **kw)
        run.wait()
        return run

    def cli(self, *args: str, tag: str = "cli", timeout: float = 120) -> tuple[int, str]:
        """A non-deploy subcommand (status, stop) on this box; (exit code, output)."""
        p = subprocess.run([sys.executable, "-m", "orchestrator", *args, "-i",
                            str(self.fleet.inventory_path), "--limit", self.host],
                           capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
        return p.returncode, p.stdout + p.stderr

    def fault(self, name: str, on: bool = True, **params: Any) -> float:
        """Switch a simulator fault on/off for this box; returns the time it took effect."""
        target = "hub" if name.startswith("hub-") else self.host
        self.fleet.fault(target, name, on=on, **params)
        return time.time()

    def converge(self, r: RowResult, what: str = "the next deploy", **kw: Any) -> Run:
        """The plain deploy must converge (exit 0) and leave nothing behind."""
        run = self.deploy(tag="converge", **kw)
        if r.expect(run.code == 0, f"{what} did not converge: exit {run.code}: "
                    f"{failure(run, self.host) or short(run.output[-400:], 400)}"):
            self.audit(run, r, label=what)
        return run

    def reset(self) -> int:
        """After a failed row: this box's faults off, then a deploy (its exit code), so that
        one failure does not spill into the next rows."""
        for h in self.fleet.status()["hosts"]:
            if h["name"] == self.host:
                for name in h["faults"]:
                    with contextlib.suppress(SimError):
                        self.fleet.fault(self.host, name, on=False)
        return self.deploy(tag="reset").wait()

    # -- facts ----------------------------------------------------------------------------------
    def server(self) -> dict[str, Any] | None:
        """The pid file of our server when its supervisor and server are alive."""
        try:
            pf = json.loads((self.state_dir / "server.pid").read_text())
        except (OSError, ValueError):
            return None
        pid, sup = int(pf.get("pid") or 0), int(pf.get("supervisor_pid") or 0)
        alive = [p for p in (pid, sup) if p and (_stat(p) or ["Z"])[0] not in ("Z", "X")]
        return pf if len(alive) == 2 else None

    def server_pid(self) -> int | None:
        pf = self.server()
        return int(pf["pid"]) if pf else None

    def host_pids(self) -> dict[int, str]:
        """Live processes carrying this box's markers (container and hypervisor)."""
        out = {}
        for name in (self.host, self.hv):
            for pid in procs.marked(value=f"{self._hash}:{name}"):
                st = _stat(pid)
                if st is not None and st[0] not in ("Z", "X"):
                    out[pid] = name
        return out

    def orphans(self, allowed: set[int] = frozenset(), wait: float = 5.0) -> list[str]:
        """Processes of the box other than our server's process group (and `allowed`)."""
        deadline = time.monotonic() + wait
        while True:
            pf = self.server()
            group = int(pf["pgid"]) if pf and pf.get("pgid") else None
            left = []
            for pid, name in sorted(self.host_pids().items()):
                st = _stat(pid)
                if st is None or pid in allowed:
                    continue
                if group is not None and int(st[2]) == group:
                    continue
                left.append(f"orphan pid {pid} on {name}: {_cmdline(pid)}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def temp_files(self) -> list[str]:
        out = []
        for top in (self.base_dir, self.hv_root / "etc" / "pve"):
            if top.is_dir():
                out += [f"temp file {p}" for p in top.rglob(".*.tmp")]
        return out

    def manifest_problems(self) -> list[str]:
        out = []
        for mf in (self.base_dir / "models").glob("*/.orchestrator/manifest.json"):
            try:
                manifest = json.loads(mf.read_text())
            except ValueError as exc:
                out.append(f"{mf}: not JSON ({exc})")
                continue
            root = mf.parent.parent
            for f in manifest.get("files", []):
                p = root / f["path"]
                if not p.is_file():
                    out.append(f"{mf}: lists {f['path']}, which is missing")
                elif p.stat().st_size != int(f["size"]):
                    out.append(f"{mf}: {f['path']} has {p.stat().st_size} bytes, manifest says "
                               f"{f['size']}")
        for name in ("server.pid", "launch.json", "fingerprint.json"):
            p = self.state_dir / name
            if p.exists():
                try:
                    json.loads(p.read_text())
                except ValueError:
                    out.append(f"{p}: half-written (not JSON)")
        return out

    def record_problems(self, run: Run) -> list[str]:
        out = []
        summary = run.summary()
        if not summary:
            return [f"no summary.json for `{' '.join(run.argv[:2])}` (run dir {run.run_dir})"]
        if not summary.get("finished_at"):
            out.append("summary.json has no finished_at")
        if summary.get("exit_code") != run.code:
            out.append(f"summary.json exit_code {summary.get('exit_code')} != process exit "
                       f"{run.code}")
        stages = (summary.get("hosts", {}).get(self.host) or {}).get("stages") or {}
        missing = [s for s in run.stage_ids if "status" not in (stages.get(s) or {})]
        if missing:
            out.append(f"summary.json has no status for stage(s) {', '.join(missing)}")
        events = run.events()
        if not events or events[-1].get("event") != "run.end":
            out.append("events.jsonl does not end with run.end (last: "
                       f"{events[-1].get('event') if events else 'nothing'})")
        return out

    def backup_problems(self, run: Run) -> list[str]:
        fix = (run.facts(self.host).get("health") or {}).get("uvm_fix") or {}
        out = []
        if fix.get("changes") or fix.get("backup"):
            backup = fix.get("backup")
            if not backup or not (self.hv_root / backup.lstrip("/")).is_file():
                out.append(f"the lxc config was edited but its backup {backup} is missing")
        conf = self.hv_root / "etc" / "pve" / "lxc" / f"{self.ctid}.conf"
        if not conf.is_file() or "lxc.cgroup2.devices.allow: c 195:* rwm" not in conf.read_text():
            out.append(f"{conf} is missing or lost its 195 line")
        return out

    def audit(self, run: Run | None, r: RowResult, allowed: set[int] = frozenset(),
              label: str = "") -> None:
        """Everything that must hold after a run, faulted or not: into r.leftovers."""
        found = self.orphans(allowed) + self.temp_files() + self.manifest_problems()
        if run is not None:
            found += self.record_problems(run) + self.backup_problems(run)
        r.leftovers += [f"{label}: {x}" if label else x for x in found]


def failure(run: Run, host: str) -> str:
    """'<stage> failed: <first line of its error>' for the first failed stage, else ''."""
    for sid, st in run.stages(host).items():
        if st.get("status") == "failed":
            return f"{sid} failed: {headline(str(st.get('error') or ''))}"
    h = run.summary().get("hosts", {}).get(host) or {}
    if h.get("error"):
        return f"{h.get('status')}: {str(h['error']).splitlines()[0]}"
    return ""


def headline(error: str) -> str:
    """The first line of an error, and its first listed problem when it lists some."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1 and lines[1].startswith("- "):
        # a list of problems ("host X is not fit to serve (2 problems):"): the first one
        more = sum(1 for ln in lines[2:] if ln.startswith("- "))
        return lines[1].removeprefix("- ") + (f" (+{more} more)" if more else "")
    return lines[0]


def changed(run: Run, host: str) -> list[str]:
    return [s for s, v in run.statuses(host).items() if v == "changed"]


def end_ts(run: Run) -> float | None:
    e = run.event(lambda e: e.get("event") == "run.end")
    return parse_ts(e["ts"]) if e else None


def failed_ts(run: Run, host: str, stage: str) -> float | None:
    e = run.event(lambda e: e.get("event") == "stage.end" and e.get("stage") == stage
                  and e.get("host") == host and e.get("status") == "failed")
    return parse_ts(e["ts"]) if e else None


def expect_failed(lab: Lab, r: RowResult, run: Run, stage: str, code: int,
                  fragments: list[str], t0: float, untouched: bool = True,
                  pid_before: int | None = None) -> None:
    """The run failed at `stage` with exit `code` and an error holding every fragment."""
    st = run.stages(lab.host).get(stage) or {}
    error = str(st.get("error") or "")
    r.outcome = f"exit {run.code}; {failure(run, lab.host) or 'no stage failed'}"
    r.expect(run.code == code, f"exit {run.code}, expected {code}")
    r.expect(st.get("status") == "failed", f"{stage} is {st.get('status')}, expected failed")
    for frag in fragments:
        r.expect(frag in error, f"the {stage} error does not say {frag!r}: {short(error, 300)}")
    ts = failed_ts(run, lab.host, stage)
    r.detect_s = None if ts is None else ts - t0
    if untouched and pid_before is not None:
        r.expect(lab.server_pid() == pid_before,
                 f"the running server was touched (pid {pid_before} -> {lab.server_pid()})")


def expect_recovered(lab: Lab, r: RowResult, run: Run, t0: float, must_change: list[str],
                     must_stay: tuple[str, ...] = ()) -> None:
    """Exit 0; the stages in must_change changed (the repair), those in must_stay stayed ok."""
    st = run.statuses(lab.host)
    ch = changed(run, lab.host)
    r.outcome = (f"exit {run.code}; recovered, changed: {', '.join(ch) or 'nothing'}"
                 if run.code == 0 else f"exit {run.code}; {failure(run, lab.host)}")
    r.expect(run.code == 0, f"exit {run.code}, expected 0: {failure(run, lab.host)}")
    for s in must_change:
        r.expect(st.get(s) == "changed", f"{s} is {st.get(s)}, expected changed")
    for s in must_stay:
        r.expect(st.get(s) == "ok", f"{s} is {st.get(s)}, expected ok (nothing to redo)")
    ts = end_ts(run)
    r.detect_s = None if ts is None else ts - t0
    r.expect(lab.server_pid() is not None, "no server is running after the recovery")


# ---------------------------------------------------------------------------- the rows

UNTOUCHED = ("venv", "packages", "target", "drafter", "inspect")


def _health_fails(fault: str, fragments: list[str], **params: Any) -> Callable[[Lab, RowResult],
                                                                               None]:
    def row(lab: Lab, r: RowResult) -> None:
        pid = lab.server_pid()
        lab.fault(fault, **params)
        run = lab.deploy(tag=fault)  # detect: from the start of the deploy
        expect_failed(lab, r, run, "health", 1, fragments, run.started, pid_before=pid)
        st = run.statuses(lab.host)
        r.expect(all(st.get(s) == "skipped" for s in STAGES[1:]),
                 f"stages after health ran: {st}")
        lab.audit(run, r)
        lab.fault(fault, on=False)
        lab.converge(r)

    return row


def row_gpu_missing(lab: Lab, r: RowResult) -> None:
    _health_fails("gpu-missing", ["found 7 GPUs, expected 8", "Xid 79", "power-cycle"])(lab, r)


def row_shm_small(lab: Lab, r: RowResult) -> None:
    _health_fails("shm-small", ["/dev/shm is 64 MiB, need >= 16 GiB", "lxc.mount.entry"])(lab, r)


def row_disk_full(lab: Lab, r: RowResult) -> None:
    _health_fails("disk-full", ["needs 570.0 GiB in total", "free", "short by"])(lab, r)


def row_driver_old(lab: Lab, r: RowResult) -> None:
    _health_fails("driver-old", ["550.54.15 is older than 570.26"])(lab, r)


def row_driver_gone(lab: Lab, r: RowResult) -> None:
    _health_fails("driver-gone", ["no GPU could be listed", "install the NVIDIA driver"])(lab, r)


def _uvm_repaired(lab: Lab, r: RowResult, run: Run, t0: float) -> None:
    expect_recovered(lab, r, run, t0, ["health", "server", "ready"], UNTOUCHED)
    fix = (run.facts(lab.host).get("health") or {}).get("uvm_fix") or {}
    r.outcome += f"; uvm fix {fix.get('action')} (major {fix.get('major')})"


def row_uvm_cgroup(lab: Lab, r: RowResult) -> None:
    t0 = lab.fault("uvm-cgroup")
    run = lab.deploy(tag="uvm-cgroup")
    _uvm_repaired(lab, r, run, t0)
    fix = (run.facts(lab.host).get("health") or {}).get("uvm_fix") or {}
    r.expect(bool(fix.get("backup")), "the lxc config was edited without a recorded backup")
    lab.audit(run, r)
    lab.converge(r)


def row_uvm_node_missing(lab: Lab, r: RowResult) -> None:
    t0 = lab.fault("uvm-node-missing")
    run = lab.deploy(tag="uvm-node-missing")
    _uvm_repaired(lab, r, run, t0)
    lab.audit(run, r)
    lab.fault("uvm-node-missing", on=False)
    lab.converge(r)


def row_reboot(lab: Lab, r: RowResult) -> None:
    res = lab.fleet.fault(lab.host, "reboot", down_seconds=1.0)
    t0 = time.time()
    run = lab.deploy("--wait-for-host", "60s", tag="reboot")
    _uvm_repaired(lab, r, run, t0)
    r.notes.append(f"uvm major re-rolled to {res.get('uvm_major')}; SSH down 1.0s")
    lab.audit(run, r)
    lab.converge(r)


def row_nvml_absent(lab: Lab, r: RowResult) -> None:
    pid = lab.server_pid()
    t0 = lab.fault("nvml-absent")
    run = lab.deploy(tag="nvml-absent")
    st = run.statuses(lab.host)
    r.outcome = (f"exit {run.code}; all ok through nvidia-smi" if run.code == 0 and
                 set(st.values()) == {"ok"} else f"exit {run.code}; {failure(run, lab.host)}")
    r.expect(run.code == 0 and set(st.values()) == {"ok"}, f"expected a converged run: {st}")
    source = ((run.facts(lab.host).get("health") or {}).get("gpus") or {}).get("source")
    r.expect(source == "nvidia-smi", f"GPU facts came from {source}, expected nvidia-smi")
    r.expect(lab.server_pid() == pid, "the server was restarted")
    ts = end_ts(run)
    r.detect_s = None if ts is None else ts - t0
    lab.audit(run, r)
    lab.fault("nvml-absent", on=False)
    lab.converge(r)


def row_stale_server(lab: Lab, r: RowResult) -> None:
    code, out = lab.cli("stop", tag="stop")
    r.expect(code == 0, f"`orchestrator stop` failed: {short(out, 300)}")
    rec = lab.fleet.fault(lab.host, "stale-server") or {}
    stale = int(rec.get("pid") or 0)
    t0 = time.time()
    run = lab.deploy(tag="stale-server")
    expect_failed(lab, r, run, "server", 1, [f"pid {stale}", "not started by us",
                                             f"kill {stale}", "stop_stale"], t0)
    r.expect(run.statuses(lab.host).get("ready") == "skipped", "ready was not skipped")
    r.expect((_stat(stale) or ["X"])[0] not in ("Z", "X"), "the stale server was killed "
             "although stop_stale is off")
    group = {p for p in lab.host_pids() if (_stat(p) or ["", "", "0"])[2] == str(stale)}
    lab.audit(run, r, allowed=group | {stale})
    lab.fault("stale-server", on=False)
    lab.converge(r)


def row_no_pip(lab: Lab, r: RowResult) -> None:
    shutil.rmtree(lab.venv)
    t0 = lab.fault("no-pip")
    run = lab.deploy(tag="no-pip")
    expect_recovered(lab, r, run, t0, ["venv", "packages"])
    repair = (run.facts(lab.host).get("venv") or {}).get("pip_repair")
    r.expect(bool(repair), "the venv was made without a recorded pip repair")
    r.outcome += f"; pip by {short(str(repair), 40)}"
    lab.audit(run, r)
    lab.fault("no-pip", on=False)
    lab.converge(r)


def _drop_weights(lab: Lab, where: Path) -> list[str]:
    """Delete the weight files (not the manifest) of a download: the next check sees them gone."""
    gone = []
    for p in sorted(where.glob("*.safetensors")):
        p.unlink()
        gone.append(p.name)
    return gone


def row_hub_flaky(lab: Lab, r: RowResult) -> None:
    gone = _drop_weights(lab, lab.drafter_dir)
    t0 = lab.fault("hub-flaky")
    try:
        run = lab.deploy(tag="hub-flaky")
    finally:
        lab.fault("hub-flaky", on=False)
    expect_recovered(lab, r, run, t0, ["drafter"], ("venv", "packages", "target"))
    r.notes.append(f"deleted {len(gone)} drafter weight file(s) before the deploy")
    lab.audit(run, r)
    lab.converge(r)


def row_hub_outage(lab: Lab, r: RowResult, fault: str) -> None:
    """A converged box and the hub out: the recorded commits are used, one warning each."""
    pid = lab.server_pid()
    t0 = lab.fault(fault)
    try:
        run = lab.deploy(tag=fault)
    finally:
        lab.fault(fault, on=False)
    facts = run.facts(lab.host)
    warned = {s: (facts.get(s) or {}).get("warnings") or [] for s in ("target", "drafter")}
    r.outcome = (f"exit {run.code}; converged, {sum(map(len, warned.values()))} warning(s)"
                 if run.code == 0 else f"exit {run.code}; {failure(run, lab.host)}")
    r.expect(run.code == 0, f"exit {run.code}, expected 0: {failure(run, lab.host)}")
    r.expect(all(len(w) == 1 for w in warned.values()), f"expected one warning each: {warned}")
    r.expect(lab.server_pid() == pid, "the server was restarted")
    ts = end_ts(run)
    r.detect_s = None if ts is None else ts - t0
    lab.audit(run, r)


def row_hub_gated(lab: Lab, r: RowResult) -> None:
    # nothing verified to fall back on: the drafter's weights and its manifest are gone
    gone = _drop_weights(lab, lab.drafter_dir)
    (lab.drafter_dir / ".orchestrator" / "manifest.json").unlink()
    r.notes.append(f"deleted {len(gone)} drafter weight file(s) and the manifest first")
    pid = lab.server_pid()
    t0 = lab.fault("hub-gated")
    try:
        run = lab.deploy(tag="hub-gated")
    finally:
        lab.fault("hub-gated", on=False)
    failed = [s for s, v in run.statuses(lab.host).items() if v == "failed"]
    stage = failed[0] if failed else "target"
    expect_failed(lab, r, run, stage, 1, ["gated", "HF_TOKEN"], t0, pid_before=pid)
    r.expect(set(failed) <= {"target", "drafter"}, f"unexpected failed stages {failed}")
    lab.audit(run, r)
    lab.converge(r)


def row_ssh_flaky(lab: Lab, r: RowResult) -> None:
    t0 = lab.fault("ssh-flaky", rate=0.5, within=2.0)
    try:
        run = lab.deploy(tag="ssh-flaky")
    finally:
        lab.fault("ssh-flaky", on=False)
    st = run.statuses(lab.host)
    ts = end_ts(run)
    r.detect_s = None if ts is None else ts - t0
    if run.code == 0:
        r.outcome = "exit 0; converged through the cut sessions"
    else:
        r.outcome = f"exit {run.code}; {failure(run, lab.host)}"
        text = failure(run, lab.host)
        r.expect(run.code in (1, 3) and ("connection" in text.lower() or "ssh" in text.lower()),
                 f"exit {run.code} without naming the lost connection: {text}")
    r.notes.append(f"statuses: {st}")
    lab.audit(run, r)
    lab.converge(r)


def row_command_hangs(lab: Lab, r: RowResult) -> None:
    pb = lab.work / "hang.yaml"
    pb.write_text(yaml.safe_dump({
        "name": "hang", "hosts": "gpu",
        "stages": [{"id": "hang", "run": "echo started; sleep 86400", "timeout": "2s"}],
    }, sort_keys=False))
    run = lab.start(playbook=pb, tag="hang")
    run.wait()
    expect_failed(lab, r, run, "hang", 1, ["timed out after 2s", "process group was killed"],
                  run.started)
    r.expect(not [p for p in lab.host_pids() if "sleep 86400" in _cmdline(p)],
             "the sleeping command survived its timeout")
    lab.audit(run, r)


def _slow(lab: Lab) -> dict[str, Any]:
    launch = copy.deepcopy(PROFILE["launch"])
    launch["env"] = {**launch["env"], "SGLANG_SIM_LOAD_SECONDS": str(SLOW_LOAD)}
    return {"launch": launch}


def row_server_crash_loading(lab: Lab, r: RowResult) -> None:
    run = lab.start(overrides=_slow(lab), tag="crash-loading")
    run.wait_event(stage_is("stage.start", "ready", lab.host), "the ready stage")
    time.sleep(0.5)  # wait_ready is polling a server that loads for SLOW_LOAD x SCALE seconds
    pid = lab.server_pid()
    if not r.expect(pid is not None, "no loading server to kill"):
        run.wait()
        return
    os.kill(pid, signal.SIGKILL)
    t0 = time.time()
    run.wait()
    expect_failed(lab, r, run, "ready", 1, ["signal 9"], t0, untouched=False)
    r.expect(r.detect_s is not None and r.detect_s < SLOW_LOAD * SCALE / 2,
             "the crash was not reported well before the load would have finished")
    lab.audit(run, r)
    lab.converge(r)


def row_server_crash_ready(lab: Lab, r: RowResult) -> None:
    """SIGKILL of a serving server: its supervisor starts it again (restart on failure, 1 s
    backoff) with no deploy; `status --verify` proves it serves and names the cause; the next
    deploy finds everything converged."""
    pid = lab.server_pid()
    if not r.expect(pid is not None, "no running server to kill"):
        return
    os.kill(pid, signal.SIGKILL)
    t0 = time.time()
    code, out = 1, ""
    while time.time() - t0 < 60:
        new = lab.server_pid()
        if new is not None and new != pid:
            code, out = lab.cli("status", "--verify", tag="status")
            if code == 0:
                break
        time.sleep(0.2)
    r.detect_s = time.time() - t0
    r.expect(code == 0, f"`orchestrator status --verify` exit {code} after the crash: "
             f"{short(out, 300)}")
    r.expect("restarted 1x" in out and "signal 9" in out,
             f"status does not name the restart and its cause: {short(out, 300)}")
    run = lab.deploy(tag="crash-ready")
    st = run.statuses(lab.host)
    r.expect(run.code == 0 and st.get("server") == "ok", f"the deploy after it: exit "
             f"{run.code}, server {st.get('server')}")
    r.outcome = (f"back by itself in {r.detect_s:.1f}s (status --verify exit {code}); deploy "
                 f"exit {run.code}, server {st.get('server')}")
    lab.audit(run, r)


def row_ssh_cut_upload(lab: Lab, r: RowResult) -> None:
    """write_file of a large file while the sim cuts SSH sessions: old or new, never partial."""
    # a cut file request is retried once after a reconnect within connect_budget (600 s by
    # default, for reboots); with every session being cut, 1.5 s keeps the row short
    spec = load_inventory(lab.fleet.inventory_path).hosts[lab.host]
    spec = spec.model_copy(update={"connect_budget": 1.5})
    path = lab.base_dir / "faults" / "upload.bin"
    size = 48 << 20  # ~0.7 s over the simulated SSH
    old = os.urandom(1 << 20) * (size >> 20)
    cuts = tries = 0
    waits: list[float] = []
    with structlog.testing.capture_logs():  # the transport's warnings: expected here
        with make_transport(spec) as t:
            t.connect(budget=30)
            Host(spec, t, {}).write_file(str(path), old)
        for i in range(1, 16):
            new = bytes([i]) * size
            lab.fault("ssh-flaky", rate=1.0, within=1.0)  # every session cut within 1 s
            error: OrchestratorError | None = None
            try:
                with make_transport(spec) as t:
                    try:
                        t.connect(budget=0.5)
                    except OrchestratorError:
                        continue  # cut before the upload started: not a try
                    tries += 1
                    t0 = time.monotonic()
                    try:
                        Host(spec, t, {}).write_file(str(path), new)
                    except OrchestratorError as exc:
                        error = exc
                        waits.append(time.monotonic() - t0)
            finally:
                lab.fault("ssh-flaky", on=False)
            # the agent learns of the cut after the client did; once it has exited (it first
            # finishes the write or removes its temp file), look at the target
            lingering = lab.orphans()
            r.expect(not lingering, f"upload {i}: {lingering}")
            data = path.read_bytes()
            state = "old" if data == old else "new" if data == new else \
                f"PARTIAL ({len(data)} bytes)"
            r.expect(not state.startswith("PARTIAL"), f"upload {i}: the target is {state}")
            leftover = lab.temp_files()
            r.expect(not leftover, f"upload {i}: {leftover}")
            if error is not None:
                cuts += 1
                r.notes.append(f"upload {i}: cut ({short(str(error), 90)}); target {state}")
            else:
                r.notes.append(f"upload {i}: completed; target {state}")
            old = data
            if cuts >= 2:
                break
    r.expect(cuts >= 1, f"no upload was cut in {tries} tries")
    # from the write_file call to its error: the cut, then one reconnect and retry
    r.detect_s = max(waits) if waits else None
    r.outcome = f"{cuts} of {tries} uploads cut; target always old or new, no temp file"
    lab.audit(None, r)
    shutil.rmtree(path.parent, ignore_errors=True)


# -- SIGINT at each stage ---------------------------------------------------------------------


def _sigint_row(stage: str, setup: Callable[[Lab], dict[str, Any] | None],
                trigger: str = "stage.apply", delay: float = 0.0,
                also: tuple[str, ...] = ()) -> Callable[[Lab, RowResult], None]:
    """Ctrl-C while `stage` runs (at its `trigger` event, + delay): exit 130, `stage` (or a
    status in `also`) interrupted, every later stage skipped, none failed; then converge."""
    def row(lab: Lab, r: RowResult) -> None:
        overrides = setup(lab)
        run = lab.start(overrides=overrides, tag=f"sigint-{stage}")
        try:
            run.wait_event(stage_is(trigger, stage, lab.host), f"{trigger} of {stage}")
        except AssertionError as exc:
            r.problems.append(str(exc))
            run.wait()
            lab.converge(r)
            return
        time.sleep(delay)
        t0 = run.sigint()
        run.wait()
        st = run.statuses(lab.host)
        hit = [s for s, v in st.items() if v == "interrupted"]
        r.outcome = (f"exit {run.code}; {stage} {st.get(stage)}; interrupted: "
                     f"{', '.join(hit) or 'none'}")
        r.expect(run.code == 130, f"exit {run.code}, expected 130")
        r.expect(st.get(stage) in ("interrupted", *also),
                 f"{stage} is {st.get(stage)}, expected interrupted{' or ' if also else ''}"
                 f"{' or '.join(also)}")
        later = STAGES[STAGES.index(stage) + 1:]
        ran = {s: st.get(s) for s in later if st.get(s) not in ("skipped", "ok", "interrupted")}
        r.expect(not ran, f"stages after {stage} did not stop: {ran}")
        r.expect("failed" not in st.values(), f"a stage failed instead: {st}")
        ts = end_ts(run)
        r.detect_s = None if ts is None else ts - t0
        lab.audit(run, r)
        lab.converge(r)

    return row


def _no_venv(lab: Lab) -> None:
    shutil.rmtree(lab.venv)


def _no_target(lab: Lab) -> None:
    shutil.rmtree(lab.target_dir)


def _no_drafter(lab: Lab) -> None:
    shutil.rmtree(lab.drafter_dir)


def _uvm_broken(lab: Lab) -> None:
    lab.fault("uvm-cgroup")


def _server_stopped(lab: Lab) -> None:
    code, _ = lab.cli("stop", tag="stop")
    assert code == 0


ROWS: list[Row] = [
    Row("reboot", "recovered: uvm fixed via hypervisor, server back, exit 0", row_reboot),
    Row("uvm-cgroup", "recovered: conf line fixed (backup), container restarted, exit 0",
        row_uvm_cgroup),
    Row("uvm-node-missing", "recovered: nvidia-modprobe on hypervisor, restart, exit 0",
        row_uvm_node_missing),
    Row("gpu-missing", "health fails: 7 of 8 GPUs, Xid 79, power-cycle; exit 1",
        row_gpu_missing, fast=True),
    Row("stale-server", "server fails: names the stale pid, `kill PID`; exit 1",
        row_stale_server),
    Row("disk-full", "health fails: disk short by N GiB; exit 1", row_disk_full),
    Row("shm-small", "health fails: /dev/shm 64 MiB < 16 GiB + lxc fix; exit 1",
        row_shm_small),
    Row("no-pip", "recovered: venv made --without-pip, pip repaired, exit 0", row_no_pip),
    Row("nvml-absent", "converged: GPU facts through nvidia-smi, exit 0", row_nvml_absent),
    Row("driver-old", "health fails: driver 550.54.15 < 570.26; exit 1", row_driver_old),
    Row("driver-gone", "health fails: no GPU could be listed; exit 1", row_driver_gone),
    Row("hub-flaky", "recovered: the cut download resumed and verified, exit 0",
        row_hub_flaky, alone=True),
    Row("hub-gated", "drafter gone, hub gated: download fails, set HF_TOKEN; exit 1; "
        "server kept", row_hub_gated, alone=True),
    Row("hub-down", "converged: recorded commits used, one warning per download; exit 0",
        lambda lab, r: row_hub_outage(lab, r, "hub-down"), alone=True),
    Row("hub-unreachable", "converged: recorded commits used, one warning per download; "
        "exit 0", lambda lab, r: row_hub_outage(lab, r, "hub-unreachable"), alone=True),
    Row("ssh-flaky", "converged (exit 0) or exit 1/3 naming the lost connection",
        row_ssh_flaky),
    Row("command-hangs", "shell stage fails at its 2s timeout, group killed; exit 1",
        row_command_hangs, fast=True),
    Row("server-crash-loading", "ready fails at once: server died (signal 9); exit 1",
        row_server_crash_loading),
    Row("server-crash-ready", "back by itself (new pid, status --verify 0); deploy ok",
        row_server_crash_ready, fast=True),
    Row("ssh-cut-upload", "write_file cut mid-upload: target old or new, no temp",
        row_ssh_cut_upload, fast=True),
    Row("sigint-health", "exit 130; a started container restart completes; then converges",
        _sigint_row("health", _uvm_broken, also=("changed",))),
    Row("sigint-venv", "exit 130 while venv is made; next deploy converges",
        _sigint_row("venv", _no_venv)),
    Row("sigint-packages", "exit 130 during pip install; next deploy converges",
        _sigint_row("packages", _no_venv)),
    Row("sigint-target", "exit 130 during the download; next deploy converges",
        _sigint_row("target", _no_target)),
    Row("sigint-drafter", "exit 130 during the download; next deploy converges",
        _sigint_row("drafter", _no_drafter)),
    Row("sigint-inspect", "exit 130 (inspect is a ~10 ms check); then converges",
        _sigint_row("inspect", _no_drafter, trigger="stage.start", also=("ok",))),
    Row("sigint-server", "exit 130 during launch/verify; next deploy converges",
        _sigint_row("server", _server_stopped)),
    Row("sigint-ready", "exit 130 while wait_ready waits; next deploy converges",
        _sigint_row("ready", _slow, trigger="stage.start", delay=0.3), fast=True),
]


# ---------------------------------------------------------------------------- the matrix


class _Gate:
    """Rows share the fleet; an `alone` row waits for the others and runs by itself."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._alone = False

    @contextlib.contextmanager
    def enter(self, alone: bool) -> Iterator[None]:
        with self._cond:
            if alone:
                self._cond.wait_for(lambda: not self._alone)
                self._alone = True
                self._cond.wait_for(lambda: self._running == 0)
            else:
                self._cond.wait_for(lambda: not self._alone)
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if alone:
                    self._alone = False
                self._cond.notify_all()


def run_row(lab: Lab, row: Row) -> RowResult:
    r = RowResult(row.name, row.expected, box=lab.host)
    lab.runs = []
    t = time.monotonic()
    try:
        row.fn(lab, r)
    except Exception as exc:  # noqa: BLE001 - a broken row is a failed row, not a crash
        r.problems.append(f"row crashed: {exc!r}")
        r.notes.append(traceback.format_exc())
        if not r.outcome:
            r.outcome = f"row crashed: {short(repr(exc), 60)}"
    finally:
        for run in lab.runs:  # nothing of a row may outlive it
            if run.proc.poll() is None:
                r.problems.append(f"{run.log.stem} was still running at the end of the row")
                run.wait(timeout=1)
            took = (run.ended or time.time()) - run.started
            r.notes.append(f"{run.log.stem}: exit {run.code} in {took:.1f}s")
    r.seconds = time.monotonic() - t
    if not r.passed:
        try:
            r.notes.append(f"box reset after the failure: deploy exit {lab.reset()}")
        except Exception as exc:  # noqa: BLE001 - the report matters more
            r.notes.append(f"box reset failed: {exc!r}")
    return r


def select(names: list[str] | None, fast: bool) -> list[Row]:
    rows = [row for row in ROWS if (not fast or row.fast)]
    if names:
        known = {row.name for row in ROWS}
        unknown = sorted(set(names) - known)
        if unknown:
            raise SystemExit(f"unknown row(s) {', '.join(unknown)}; rows: {', '.join(known)}")
        rows = [row for row in ROWS if row.name in names]
    return rows


def run_matrix(rows: list[Row], work: Path, jobs: int = 1, scale: float = SCALE,
               log: Callable[[str], None] = print) -> tuple[list[RowResult], dict[str, Any]]:
    """Start a fleet of `jobs` boxes, converge them, run the rows, stop the fleet.

    Returns the row results (in `rows` order) and run facts: setup seconds, total seconds, and
    `left` (processes of the simulator still alive after SimFleet.down: must be empty)."""
    t_all = time.monotonic()
    jobs = max(1, min(jobs, len(rows)))
    fleet = SimFleet.up(work / "sim", hosts=jobs, time_scale=scale)
    daemon = fleet.daemon_pid()
    info: dict[str, Any] = {"boxes": jobs, "time_scale": scale}
    results: dict[str, RowResult] = {}
    labs: list[Lab] = []
    try:
        hosts = [h["name"] for h in fleet.info()["hosts"] if h["name"].startswith("gpu-")]
        labs = [Lab(fleet, h, work / h) for h in hosts]
        t = time.monotonic()
        first = [lab.start(tag="first") for lab in labs]
        for lab, run in zip(labs, first, strict=True):
            if run.wait() != 0:
                raise RuntimeError(f"the first deploy on {lab.host} failed (exit {run.code}):\n"
                                   f"{run.output[-3000:]}")
        info["setup_s"] = round(time.monotonic() - t, 1)
        log(f"fleet of {jobs} box(es) converged in {info['setup_s']}s; {len(rows)} row(s)")
        queue = list(rows)
        qlock = threading.Lock()
        gate = _Gate()

        def worker(lab: Lab) -> None:
            while True:
                with qlock:
                    if not queue:
                        return
                    row = queue.pop(0)
                with gate.enter(row.alone):
                    res = run_row(lab, row)
                results[row.name] = res
                log(f"  {'PASS' if res.passed else 'FAIL'} {row.name:<22} {res.seconds:6.1f}s "
                    f"({lab.host})")

        threads = [threading.Thread(target=worker, args=(lab,), name=lab.host) for lab in labs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        for lab in labs:  # a deploy still running (setup failed on another box)
            for run in lab.runs:
                if run.proc.poll() is None:
                    run.wait(timeout=0.1)
        fleet.down()
        deadline = time.monotonic() + 10
        prefix = f"{dir_hash(fleet.simdir)}:"
        while True:
            left = procs.marked(prefix=prefix)
            if daemon is not None and procs.alive(daemon):
                left.append(daemon)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        info["left"] = left
        info["total_s"] = round(time.monotonic() - t_all, 1)
    return [results[row.name] for row in rows if row.name in results], info


def table(results: list[RowResult]) -> str:
    """fault | expected | outcome | detect | leftovers | result, one row per fault."""
    head = ("fault", "expected", "outcome", "detect", "leftovers", "result")
    rows = []
    for r in results:
        det = "-" if r.detect_s is None else f"{r.detect_s:.2f}s"
        left = "none" if not r.leftovers else f"{len(r.leftovers)}: {short(r.leftovers[0], 40)}"
        rows.append((r.fault, short(r.expected, 58), short(r.outcome, 76), det, left,
                     "PASS" if r.passed else "FAIL"))
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    sep = "-+-".join("-" * w for w in widths)
    return "\n".join([line(head), sep, *[line(x) for x in rows]])


def details(results: list[RowResult]) -> str:
    out = []
    for r in results:
        if r.passed:
            continue
        out.append(f"FAIL {r.fault} ({r.box}, {r.seconds:.1f}s): {r.outcome}")
        out += [f"    problem: {p}" for p in r.problems]
        out += [f"    leftover: {x}" for x in r.leftovers]
        out += [f"    note: {n}" for n in r.notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="only the quick subset (the test's)")
    ap.add_argument("--only", action="append", metavar="NAME", help="only these rows")
    ap.add_argument("--jobs", type=int, default=2, help="boxes working in parallel (default 2)")
    ap.add_argument("--time-scale", type=float, default=SCALE)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    rows = select(args.only, args.fast)
    work = Path(tempfile.mkdtemp(prefix="faults-"))
    try:
        results, info = run_matrix(rows, work, jobs=args.jobs, scale=args.time_scale)
    except (RuntimeError, SimError) as exc:  # the fleet never got converged: no row ran
        print(f"faults: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(results))
    text = details(results)
    if text:
        print()
        print(text)
    failed = [r.fault for r in results if not r.passed]
    missing = [row.name for row in rows if row.name not in {r.fault for r in results}]
    print()
    print(f"{len(results) - len(failed)} of {len(rows)} rows passed; {info['boxes']} box(es), "
          f"setup {info.get('setup_s', '-')}s, total {info['total_s']}s"
          + (f"; work dir kept: {work}" if args.keep else ""))
    if info["left"]:
        print(f"LEFT BEHIND after SimFleet.down: pids {info['left']}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"results": [r.as_dict() for r in results], **info}, indent=1) + "\n")
    return 0 if not failed and not missing and not info["left"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
