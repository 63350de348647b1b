"""Side by side: a CONVERGED re-run of `orchestrator deploy playbooks/kimi-k2.6-eagle3.yaml`
versus the same converged checks done by Ansible, pyinfra and Fabric, and the sshd floor.

    python scripts/bench_converged.py [--hosts 1,4,16] [--repeat 3] [--tools LIST]
                                      [--json runs/bench/converged.json] [--keep-sim]
                                      [--sim-dir DIR] [--negative]

One simulator (`orchestrator sim up --sshd openssh`: real OpenSSH on loopback) with as many GPU
hosts as the largest size; one first deploy converges them all. Then, for each size, `--repeat`
rounds of every tool in turn (round robin, so a drift of the machine spreads over all tools):

* orchestrator: `orchestrator deploy PLAYBOOK -i INVENTORY [--limit ...]`, the whole process;
  it must exit 0 with every stage of every host `ok` (converged: nothing changed);
* pyinfra, Fabric, Ansible: bench/anchors/ (docs/bench-anchors.md maps each of their tasks to
  our stage checks), on the same hosts through inventories generated from ours; each must exit
  0 AND show that every check passed on every host (Ansible: the PLAY RECAP has every task ok
  on every host; pyinfra and Fabric print `bench-check-ok HOST CHECK` per check);
* floor: N parallel `ssh ... true` with the OpenSSH client (the sshd sessions alone).

Measured per run: wall time of the whole process, peak RSS (ru_maxrss from wait4: the largest
single process of the tree), client CPU (user+sys of the tree) and the machine's CPU time over
the run (/proc/stat; the simulated hosts' side runs on this machine too). Reported: median wall
of the repeats, per host, the largest peak RSS, and the ratio of each tool to ours. The anchors
install on first use into .venv-bench/<tool>/ at the pinned versions below. `--negative` first
proves the checks can fail: it truncates a target file on the first host, expects every tool to
fail there, and lets our deploy restore it.
"""

from __future__ import annotations

import argparse
import json
import os
import pprint
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jinja2 import StrictUndefined
from jinja2.nativetypes import NativeEnvironment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = REPO / "playbooks/kimi-k2.6-eagle3.yaml"
ANCHORS = REPO / "bench/anchors"
BENCH_VENV = REPO / ".venv-bench"
TOOLS = ("orchestrator", "pyinfra", "fabric", "ansible", "floor")
#: each anchor's own venv under .venv-bench/, exactly these versions (the first names the tool)
PINS = {
    "ansible": ("ansible-core==2.19.14",),
    "pyinfra": ("pyinfra==3.10.0",),
    "fabric": ("fabric==3.2.3", "packaging==26.4"),
}
LABELS = {"orchestrator": "orchestrator", "floor": "floor (ssh true)",
          **{t: f"{t.capitalize() if t != 'pyinfra' else t} {pins[0].split('==')[1]}"
             for t, pins in PINS.items()}}
#: the checks the pyinfra and Fabric anchors report per host (our stage ids; health split in two)
CHECKS = ("health.gpus", "health.uvm", "venv", "packages", "target", "drafter", "inspect",
          "server", "ready")
MIB = 1024


# ------------------------------------------------------------------------------ set-up


def anchor_python(tool: str) -> Path:
    """.venv-bench/TOOL/bin/python with PINS[tool] installed (installed on first use)."""
    venv = BENCH_VENV / tool
    py, stamp = venv / "bin" / "python", venv / ".bench-pins"
    want = "\n".join(PINS[tool]) + "\n"
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    print(f"installing {' '.join(PINS[tool])} into {venv.relative_to(REPO)} (first use)",
          flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *PINS[tool]], check=True)
    stamp.write_text(want)
    return py


class _Loader(yaml.SafeLoader):
    """YAML loader that reads our `!env VAR:-default` tags as empty strings (secrets)."""


_Loader.add_constructor("!env", lambda loader, node: "")


def _load(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _render(value: Any, ctx: dict[str, Any], env: NativeEnvironment) -> Any:
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        return env.from_string(value).render(**ctx)
    if isinstance(value, dict):
        return {k: _render(v, ctx, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, ctx, env) for v in value]
    return value


def rendered_stages(playbook: dict[str, Any], host_vars: dict[str, Any]) -> dict[str, Any]:
    """{stage id: {"uses": kind, **params}} of the playbook for one host: vars_files < vars <
    the inventory's host vars, templates rendered to a fixed point."""
    ctx: dict[str, Any] = {}
    for name in playbook.get("vars_files", []):
        ctx.update(_load((PLAYBOOK.parent / name).resolve()))
    ctx.update(playbook.get("vars", {}))
    ctx.update(host_vars)
    env = NativeEnvironment(undefined=StrictUndefined)
    for _ in range(20):
        new = {k: _render(v, ctx, env) for k, v in ctx.items()}
        if new == ctx:
            break
        ctx = new
    return {st["id"]: {"uses": st["uses"], **_render(st.get("with", {}), ctx, env)}
            for st in playbook["stages"]}


def _one(stages: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [s for s in stages.values() if s["uses"] == kind]
    if len(found) != 1:
        raise SystemExit(f"{PLAYBOOK.name}: expected one {kind} stage, found {len(found)}")
    return found[0]


def anchor_spec(inventory: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """What every anchor needs: per host its address and paths, and `expect` (the playbook's
    and the profile's requirements), both rendered from the shipped playbook."""
    playbook = _load(PLAYBOOK)
    hosts, expect = [], None
    for name in names:
        h = inventory["hosts"][name]
        group_vars = (inventory.get("groups", {}).get(playbook["hosts"], {}) or {}).get("vars")
        stages = rendered_stages(playbook, {**(group_vars or {}), **(h.get("vars") or {})})
        health, pip = _one(stages, "host_health"), _one(stages, "pip_install")
        server, ready = _one(stages, "sglang_server"), _one(stages, "wait_ready")
        inspect = _one(stages, "inspect_config")
        downloads = {s["local_dir"]: s for s in stages.values() if s["uses"] == "hf_download"}
        target, drafter = downloads[server["model_path"]], downloads[server["draft_model_path"]]
        hosts.append({
            "name": name, "address": h["address"], "port": int(h["port"]), "user": h["user"],
            "identity_file": h["identity_file"], "known_hosts": h["known_hosts"],
            "venv": _one(stages, "python_venv")["path"], "target_dir": target["local_dir"],
            "drafter_dir": drafter["local_dir"], "state_dir": server["state_dir"],
            "base_url": str(ready["url"]).rstrip("/"), "hf_endpoint": target["endpoint"],
        })
        reqs = [Requirement(r) for r in pip["requirements"]]
        mine = {
            "gpus": int(health["gpus"]),
            "min_gpu_memory_mib": int(float(health["min_gpu_memory_gib"]) * 1024),
            "compute_capability": str(health["compute_capability"]),
            "min_driver": str(health["min_driver"]),
            "min_shm_gib": float(health["min_shm_gib"]),
            "pins": [{"name": canonicalize_name(r.name), "specifier": str(r.specifier),
                      "constraints": [{"op": s.operator, "version": s.version}
                                      for s in r.specifier]} for r in reqs],
            "target": {"repo": target["repo"], "revision": target["revision"],
                       "architecture": ready["expect_architectures"][0]},
            "drafter": {"repo": drafter["repo"], "revision": drafter["revision"],
                        "architecture": inspect["expect"]["architectures"]["contains"],
                        "num_hidden_layers": inspect["expect"]["num_hidden_layers"]["equals"]},
            "same_as_target": sorted(k for k, rule in inspect["expect"].items()
                                     if "equals_reference" in rule),
            "served_model_name": server["served_model_name"],
            "min_accept_length": float(ready["min_accept_length"]),
        }
        if expect is not None and mine != expect:
            raise SystemExit(f"{name}: the playbook asks other things of it than of the others")
        expect = mine
    return {"expect": expect, "hosts": hosts}


def write_inventories(spec: dict[str, Any], out: Path) -> dict[str, Path]:
    """The spec as each tool's inventory: Ansible YAML, pyinfra Python, Fabric JSON."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"ansible": out / "ansible.yml", "pyinfra": out / "pyinfra_inventory.py",
             "fabric": out / "fabric.json"}
    keys = ("venv", "target_dir", "drafter_dir", "state_dir", "base_url", "hf_endpoint")
    ansible_hosts = {
        h["name"]: {
            "ansible_host": h["address"], "ansible_port": h["port"], "ansible_user": h["user"],
            "ansible_ssh_private_key_file": h["identity_file"],
            "ansible_ssh_extra_args": f"-o UserKnownHostsFile={h['known_hosts']} "
                                      "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
            **{k: h[k] for k in keys}}
        for h in spec["hosts"]}
    paths["ansible"].write_text(yaml.safe_dump(
        {"all": {"children": {"gpu": {"hosts": ansible_hosts,
                                      "vars": {"expect": spec["expect"]}}}}}, sort_keys=False))
    pyinfra_hosts = [
        (h["name"], {"ssh_hostname": h["address"], "ssh_port": h["port"], "ssh_user": h["user"],
                     "ssh_key": h["identity_file"], "ssh_known_hosts_file": h["known_hosts"],
                     "ssh_strict_host_key_checking": "yes", "ssh_allow_agent": False,
                     "ssh_look_for_keys": False, **{k: h[k] for k in keys}})
        for h in spec["hosts"]]
    paths["pyinfra"].write_text(
        '"""pyinfra inventory generated by scripts/bench_converged.py."""\n\n'
        f"gpu = {pprint.pformat((pyinfra_hosts, {'expect': spec['expect']}), width=100)}\n")
    paths["fabric"].write_text(json.dumps(spec, indent=1))
    return paths


# ------------------------------------------------------------------------------ measuring


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One timed run of one tool."""

    tool: str
    hosts: int
    repeat: int
    wall_s: float
    rc: int | None
    ok: bool
    why: str
    maxrss_mib: float
    cpu_s: float
    machine_cpu_s: float
    log: str
    #: the untimed run of the same tool on the same hosts just before this one (`--warm-each`)
    warm_wall_s: float | None = None


def measure(argv: list[str], *, env: dict[str, str], cwd: Path, log: Path,
            timeout: float) -> tuple[float, int | None, float, float, float]:
    """Run ARGV as a new session; (wall s, exit code or None on timeout, maxrss MiB,
    user+sys s of its tree, machine busy s)."""
    busy0 = machine_busy_s()
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    with_children = usage.ru_utime + usage.ru_stime
    return (wall, None if killed.is_set() else proc.returncode, usage.ru_maxrss / MIB,
            with_children, machine_busy_s() - busy0)


def background_cores(seconds: float = 2.0) -> float:
    """How many cores the machine keeps busy while nothing of ours runs (others' load)."""
    busy0, t0 = machine_busy_s(), time.monotonic()
    time.sleep(seconds)
    return round((machine_busy_s() - busy0) / (time.monotonic() - t0), 2)


def _tail(log: Path, n: int = 15) -> str:
    lines = log.read_text(errors="replace").rstrip().splitlines()
    return "\n".join("    " + ln for ln in lines[-n:])


class Bench:
    """The tools' command lines and the verdicts on their runs, for one simulator."""

    def __init__(self, args: argparse.Namespace, inventory_path: Path, work: Path) -> None:
        self.args, self.inventory_path, self.work = args, inventory_path, work
        self.inventory = yaml.safe_load(inventory_path.read_text())
        gpu = self.inventory["groups"]["gpu"]["hosts"]
        self.gpu_hosts = sorted(gpu, key=lambda n: int(n.rsplit("-", 1)[1]))
        self.orchestrator = shlex.split(args.orchestrator) if args.orchestrator else (
            [str(REPO / ".venv/bin/orchestrator")] if (REPO / ".venv/bin/orchestrator").exists()
            else [sys.executable, "-m", "orchestrator"])
        self.pythons: dict[str, Path] = {}
        for tool in [t for t in PINS if t in args.tools]:
            try:
                self.pythons[tool] = anchor_python(tool)
            except (subprocess.CalledProcessError, OSError) as exc:
                print(f"{tool}: cannot install {' '.join(PINS[tool])} ({exc}); left out",
                      flush=True)
                args.tools.remove(tool)
        self.ansible_tasks = len(_load(ANCHORS / "ansible/converged.yml")[0]["tasks"])
        self.inventories: dict[int, dict[str, Path]] = {}
        self.specs: dict[int, dict[str, Any]] = {}

    def names(self, n: int) -> list[str]:
        return self.gpu_hosts[:n]

    def prepare(self, n: int) -> None:
        spec = anchor_spec(self.inventory, self.names(n))
        self.specs[n] = spec
        self.inventories[n] = write_inventories(spec, self.work / f"inventories/{n}")

    # ---------------------------------------------------------------- one run of one tool

    def run(self, tool: str, n: int, repeat: int, tag: str = "") -> Run:
        names = self.names(n)
        log = self.work / "logs" / f"{tool}-{n}-{tag or repeat}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ}
        if tool != "orchestrator":
            env.pop("PYTHONPATH", None)
        cwd, after, runs = REPO, None, self.work / "runs" / f"{n}-{tag or repeat}"
        if tool == "orchestrator":
            # one run dir per host count, kept from run to run as an operator's runs/ is
            runs = self.work / "runs" / f"orchestrator-{n}"
            env["ORCHESTRATOR_RUN_DIR"] = str(runs)
            argv = [*self.orchestrator, "deploy", str(PLAYBOOK), "-i", str(self.inventory_path)]
            if n < len(self.gpu_hosts):
                argv += ["--limit", ",".join(names)]
        elif tool == "pyinfra":
            cwd = ANCHORS / "pyinfra"
            argv = [str(self.pythons["pyinfra"].parent / "pyinfra"),
                    str(self.inventories[n]["pyinfra"]), "deploy.py", "-y", "--parallel", str(n)]
        elif tool == "fabric":
            cwd = ANCHORS / "fabric"
            argv = [str(self.pythons["fabric"]), "converged.py", str(self.inventories[n]["fabric"])]
        elif tool == "ansible":
            cwd = ANCHORS / "ansible"
            cp = Path(tempfile.mkdtemp(prefix="bcp", dir="/tmp"))  # short: a socket path
            env.update(ANSIBLE_CONFIG=str(cwd / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                       ANSIBLE_SSH_CONTROL_PATH_DIR=str(cp),
                       ANSIBLE_LOCAL_TEMP=str(self.work / "ansible-tmp"))
            argv = [str(self.pythons["ansible"].parent / "ansible-playbook"),
                    "-i", str(self.inventories[n]["ansible"]), "--forks", str(n), "converged.yml"]
            after = cp
        elif tool == "floor":
            argv = ["bash", "-c", self.floor_script(n)]
        else:
            raise ValueError(tool)
        wall, rc, rss, cpu, busy = measure(argv, env=env, cwd=cwd, log=log,
                                           timeout=self.args.timeout)
        if after is not None:
            close_masters(after)
        ok, why = self.verdict(tool, n, rc, log, runs)
        return Run(tool, n, repeat, round(wall, 3), rc, ok, why, round(rss, 1), round(cpu, 2),
                   round(busy, 2), str(log))

    def first_connect(self, repeat: int) -> dict[str, Any]:
        """Seconds from exec to our first SSH connect() at 1 host (scripts/first_connect.py),
        each run a whole converged deploy; the median is printed."""
        env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(self.work / "runs" / "first")}
        argv = [sys.executable, str(REPO / "scripts/first_connect.py"), "deploy",
                str(PLAYBOOK), "-i", str(self.inventory_path), "--limit", self.names(1)[0]]
        seen: list[float] = []
        for _ in range(repeat):
            env["ORCH_T0"] = repr(time.time())
            p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=self.args.timeout)
            seen += [float(line.split()[1]) for line in p.stderr.splitlines()
                     if line.startswith("first-connect-s ")]
        median = statistics.median(seen) if seen else None
        print(f"  1 host   orchestrator      first SSH connect after exec: "
              f"{', '.join(f'{s:.3f}' for s in seen)} s (median {median})", flush=True)
        return {"runs_s": seen, "median_s": median}

    def floor_script(self, n: int) -> str:
        lines = ["pids=()"]
        for h in self.specs[n]["hosts"]:
            argv = ["ssh", "-F", "/dev/null", "-i", h["identity_file"],
                    "-o", f"UserKnownHostsFile={h['known_hosts']}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                    "-o", "IdentitiesOnly=yes", "-o", "ControlPath=none",
                    "-p", str(h["port"]), f"{h['user']}@{h['address']}", "true"]
            lines.append(shlex.join(argv) + " & pids+=($!)")
        lines.append('rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc')
        return "\n".join(lines)

    def verdict(self, tool: str, n: int, rc: int | None, log: Path,
                runs: Path) -> tuple[bool, str]:
        """Did the run succeed AND show that every check passed on every host?"""
        if rc is None:
            return False, f"timed out after {self.args.timeout:.0f}s"
        if rc != 0:
            return False, f"exit {rc}"
        names = self.names(n)
        text = log.read_text(errors="replace")
        if tool == "orchestrator":
            found = sorted(runs.glob("*/summary.json"))
            if not found:
                return False, "no run record (summary.json)"
            summary = json.loads(found[-1].read_text())
            if sorted(summary.get("hosts", {})) != sorted(names):
                return False, f"summary hosts {sorted(summary.get('hosts', {}))}"
            not_ok = [f"{h}/{sid}={st.get('status')}" for h, v in summary["hosts"].items()
                      for sid, st in v.get("stages", {}).items() if st.get("status") != "ok"]
            return (False, "not converged: " + ", ".join(not_ok[:6])) if not_ok else (True, "")
        if tool in ("pyinfra", "fabric"):
            seen = {tuple(line.split()[1:3]) for line in text.splitlines()
                    if line.startswith("bench-check-ok ")}
            missing = [f"{h}/{c}" for h in names for c in CHECKS if (h, c) not in seen]
            return (False, "checks not reported: " + ", ".join(missing[:6])) if missing else (
                True, "")
        if tool == "ansible":
            recap = {}
            for line in text.split("PLAY RECAP", 1)[-1].splitlines():
                parts = line.split()
                if len(parts) > 2 and parts[1] == ":":
                    recap[parts[0]] = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            bad = [f"{h}: {recap.get(h)}" for h in names
                   if recap.get(h, {}).get("ok") != str(self.ansible_tasks)
                   or recap[h].get("failed") != "0" or recap[h].get("unreachable") != "0"
                   or recap[h].get("changed") != "0"]
            return (False, "recap: " + "; ".join(bad[:4])) if bad else (True, "")
        return True, ""


def close_masters(control_dir: Path) -> None:
    """End the ControlPersist masters a run left (not timed), so every run starts cold."""
    for sock in control_dir.iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench"],
                       capture_output=True, timeout=30)
    shutil.rmtree(control_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ reporting


@dataclass
class Row:
    """The figures of one tool at one size."""

    hosts: int
    tool: str
    ok: bool
    median_wall_s: float | None
    per_host_s: float | None
    peak_rss_mib: float | None
    median_cpu_s: float | None
    median_machine_cpu_s: float | None
    ratio_to_orchestrator: float | None = None
    runs: list[Run] = field(default_factory=list)


@dataclass
class Results:
    """What runs/bench/converged.json holds (`to_json`)."""

    playbook: str
    machine: dict[str, Any]
    #: our commit, whether orchestrator/ had changes, the command timed
    orchestrator: dict[str, Any]
    anchors: dict[str, list[str]]
    repeat: int
    warm_each: bool
    sizes: list[int]
    tools: list[str]
    #: --negative: which tool detected the truncated file, and our repair
    negative: dict[str, Any] | None
    first_connect_s: dict[str, Any] | None
    load: dict[str, float]
    ok: bool
    took_s: float
    results: list[Row]
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def to_json(self) -> dict[str, Any]:
        """The JSON document."""
        return {"benchmark": "converged re-run, side by side", **asdict(self)}


def summarize(runs: list[Run], sizes: list[int], tools: list[str]) -> list[Row]:
    rows = []
    for n in sizes:
        ours = None
        for tool in tools:
            mine = [r for r in runs if r.tool == tool and r.hosts == n]
            if not mine:
                continue
            walls = [r.wall_s for r in mine]
            med = statistics.median(walls)
            row = Row(n, tool, all(r.ok for r in mine), round(med, 3), round(med / n, 3),
                      max(r.maxrss_mib for r in mine),
                      round(statistics.median(r.cpu_s for r in mine), 2),
                      round(statistics.median(r.machine_cpu_s for r in mine), 2),
                      runs=mine)
            if tool == "orchestrator":
                ours = row
            rows.append(row)
        for row in rows:
            if row.hosts == n and ours is not None and ours.ok and row.ok and ours.median_wall_s:
                row.ratio_to_orchestrator = round(row.median_wall_s / ours.median_wall_s, 2)
    return rows


def print_tables(rows: list[Row], sizes: list[int], tools: list[str], repeat: int) -> None:
    print(f"\nconverged re-run, whole process, median of {repeat} (x = tool / orchestrator)")
    head = ["hosts"] + [LABELS[t] for t in tools]
    table = []
    for n in sizes:
        cells = [str(n)]
        for tool in tools:
            row = next((r for r in rows if r.hosts == n and r.tool == tool), None)
            if row is None:
                cells.append("-")
                continue
            cell = f"{row.median_wall_s:.2f} s"
            if row.ratio_to_orchestrator is not None and tool != "orchestrator":
                cell += f" ({row.ratio_to_orchestrator:.1f}x)"
            cells.append(cell if row.ok else cell + " FAILED")
        table.append(cells)
    widths = [max(len(c[i]) for c in [head, *table]) for i in range(len(head))]
    for cells in [head, ["-" * w for w in widths], *table]:
        print(" | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
    print(f"\n{'hosts':>5}  {'tool':<17} {'wall s':>7} {'per host':>8} {'peak RSS':>9} "
          f"{'client CPU':>10} {'machine CPU':>11} {'ratio':>6}  runs (wall s)")
    for r in rows:
        ratio = f"{r.ratio_to_orchestrator:.2f}" if r.ratio_to_orchestrator is not None else "-"
        walls = " ".join(f"{x.wall_s:.2f}" for x in r.runs)
        print(f"{r.hosts:>5}  {LABELS[r.tool]:<17} {r.median_wall_s:>7.2f} {r.per_host_s:>8.3f} "
              f"{r.peak_rss_mib:>5.0f} MiB {r.median_cpu_s:>8.2f} s {r.median_machine_cpu_s:>9.2f} "
              f"s {ratio:>6}  {walls}{'' if r.ok else '  FAILED'}")


def _git(*args: str) -> str:
    p = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return p.stdout.strip()


# ------------------------------------------------------------------------------ main


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", "sim", *args], cwd=REPO,
                          capture_output=True, text=True)


def converge(bench: Bench, label: str) -> None:
    """Our deploy on every GPU host (first deploy, or a repair); it must exit 0."""
    t0 = time.monotonic()
    log = bench.work / "logs" / f"converge-{label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(bench.work / "runs" / f"converge-{label}")}
    with open(log, "wb") as out:
        p = subprocess.run([*bench.orchestrator, "deploy", str(PLAYBOOK), "-i",
                            str(bench.inventory_path)], cwd=REPO, env=env, stdout=out,
                           stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise SystemExit(f"converging deploy ({label}) failed, exit {p.returncode}; "
                         f"last lines of {log}:\n{_tail(log, 25)}")
    print(f"converged {len(bench.gpu_hosts)} hosts ({label}) in {time.monotonic() - t0:.1f}s",
          flush=True)


def negative(bench: Bench, tools: list[str]) -> dict[str, Any]:
    """Truncate a target weight file on the first host: every tool must fail there; then our
    deploy repairs it (and a second one must find the host converged)."""
    spec = bench.specs[1]["hosts"][0]
    manifest = json.loads((Path(spec["target_dir"]) / ".orchestrator/manifest.json").read_text())
    victim = max(manifest["files"], key=lambda f: f["size"])
    path = Path(spec["target_dir"]) / victim["path"]
    with open(path, "r+b") as f:
        f.truncate(victim["size"] // 2)
    print(f"negative check: truncated {spec['name']}:{path.name} to {victim['size'] // 2} bytes",
          flush=True)
    order = [t for t in tools if t not in ("floor", "orchestrator")] + ["orchestrator"]
    outcome = {}
    for tool in order:
        if tool not in tools:
            continue
        r = bench.run(tool, 1, 0, tag="negative")
        outcome[tool] = {"detected": not r.ok, "why": r.why or "passed", "log": r.log}
        print(f"  {LABELS[tool]:<17} {'detected' if not r.ok else 'NOT DETECTED'}: "
              f"{r.why or 'passed'}", flush=True)
    if "orchestrator" not in tools:
        converge(bench, "repair")
    r = bench.run("orchestrator", 1, 0, tag="after-repair")
    outcome["repaired"] = r.ok
    print(f"  after our repair: {'converged' if r.ok else 'NOT converged: ' + r.why}", flush=True)
    return outcome


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,4,16", help="sizes, comma separated (default 1,4,16)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per tool and size")
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help=f"comma separated, of: {', '.join(TOOLS)}")
    ap.add_argument("--json", default="runs/bench/converged.json", help="where to write results")
    ap.add_argument("--keep-sim", action="store_true", help="leave the simulator running")
    ap.add_argument("--sim-dir", help="use this running simulator (`sim up --sshd openssh`) "
                    "instead of starting one; it is left running")
    ap.add_argument("--orchestrator", help="our command line (default .venv/bin/orchestrator)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs per tool at 1 host before the timed rounds (only with "
                         "--warm-each 0: otherwise each timed run has its own)")
    ap.add_argument("--warm-each", type=int, default=1, choices=(0, 1),
                    help="1 (default): an untimed run of the same tool on the same hosts just "
                         "before each timed run, so that no tool is timed on a cold page cache "
                         "(see docs/bench-anchors.md); 0: none")
    ap.add_argument("--negative", action="store_true",
                    help="first prove that every tool fails on a truncated file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    args = ap.parse_args()
    sizes = sorted({int(x) for x in args.hosts.split(",") if x.strip()})
    tools = [t for t in TOOLS if t in {x.strip() for x in args.tools.split(",")}]
    unknown = {x.strip() for x in args.tools.split(",")} - set(TOOLS)
    if unknown or not tools or not sizes or min(sizes) < 1:
        ap.error(f"bad --tools/--hosts (unknown tools: {sorted(unknown)})")
    args.tools = tools
    missing = [p for p in ("sshd", "ssh") if not any(
        Path(d, p).exists() for d in ("/usr/sbin", "/usr/local/sbin")) and not shutil.which(p)]
    if missing:
        print(f"bench_converged: skipped, OpenSSH not installed ({', '.join(missing)} missing; "
              "scripts/test-prereqs.sh installs it)")
        return 0
    started = time.monotonic()
    # our package's bytecode, as an installed (non-editable) package has it: under
    # PYTHONDONTWRITEBYTECODE every run would compile ~100 modules again (the anchors' own
    # packages were byte-compiled by pip when they were installed)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "orchestrator")],
                   capture_output=True, check=False)
    work = Path(tempfile.mkdtemp(prefix="bench-converged-"))
    owned = args.sim_dir is None
    simdir = work / "sim" if owned else Path(args.sim_dir)
    if owned:
        print(f"starting {max(sizes)} simulated GPU hosts behind OpenSSH in {simdir}", flush=True)
        p = sim("up", "--dir", str(simdir), "--hosts", str(max(sizes)), "--sshd", "openssh")
        if p.returncode != 0:
            print(p.stdout + p.stderr, file=sys.stderr)
            return 2
    all_ok = True
    try:
        bench = Bench(args, simdir / "inventory.yaml", work)
        if len(bench.gpu_hosts) < max(sizes):
            raise SystemExit(f"{simdir} has {len(bench.gpu_hosts)} GPU hosts, "
                             f"{max(sizes)} needed")
        converge(bench, "first")
        for n in sorted({1, *sizes}):
            bench.prepare(n)
        checked = negative(bench, tools) if args.negative else None
        for tool in tools:
            for i in range(0 if args.warm_each else args.warmup):
                r = bench.run(tool, 1, 0, tag=f"warmup{i}")
                if not r.ok:
                    print(f"warm-up of {tool} failed: {r.why}\n{_tail(Path(r.log))}", flush=True)
        idle = background_cores()
        load = {"background_cores_before": idle, "loadavg_before": os.getloadavg()[0]}
        if idle > 0.25:
            print(f"note: the machine keeps {idle} of {os.cpu_count()} cores busy with nothing of "
                  "ours running; every figure below includes that load", flush=True)
        runs: list[Run] = []
        for n in sizes:
            for rep in range(1, args.repeat + 1):
                for tool in tools:
                    warm = bench.run(tool, n, rep, tag=f"warm{rep}") if args.warm_each else None
                    r = bench.run(tool, n, rep)
                    r.warm_wall_s = warm.wall_s if warm is not None else None
                    runs.append(r)
                    status = "ok" if r.ok else f"FAILED ({r.why}), log {r.log}"
                    before = f" (untimed run before: {warm.wall_s:.2f}s)" if warm else ""
                    print(f"{n:>3} hosts  {LABELS[tool]:<17} run {rep}: {r.wall_s:7.2f}s  "
                          f"{r.maxrss_mib:5.0f} MiB  {status}{before}", flush=True)
                    if not r.ok:
                        print(_tail(Path(r.log)), flush=True)
        first = bench.first_connect(args.repeat) if "orchestrator" in tools else None
        load.update(background_cores_after=background_cores(),
                    loadavg_after=os.getloadavg()[0])
        rows = summarize(runs, sizes, tools)
        all_ok = all(r.ok for r in rows)
        print_tables(rows, sizes, tools, args.repeat)
        print(f"\nbackground load (nothing of ours running): {load['background_cores_before']} "
              f"cores busy before, {load['background_cores_after']} after, of {os.cpu_count()}")
        out = Path(args.json)
        out = out if out.is_absolute() else REPO / out
        out.parent.mkdir(parents=True, exist_ok=True)
        dirty = bool(_git("status", "--porcelain", "--", "orchestrator"))
        out.write_text(json.dumps(Results(
            playbook=str(PLAYBOOK.relative_to(REPO)),
            machine={"cpus": os.cpu_count(), "python": sys.version.split()[0],
                     "openssh": subprocess.run(["ssh", "-V"], capture_output=True,
                                               text=True).stderr.strip()},
            orchestrator={"commit": _git("rev-parse", "HEAD"), "dirty": dirty,
                          "command": bench.orchestrator[-1]},
            anchors={t: list(PINS[t]) for t in PINS if t in tools}, repeat=args.repeat,
            warm_each=bool(args.warm_each), sizes=sizes, tools=tools, negative=checked,
            first_connect_s=first, load=load, ok=all_ok,
            took_s=round(time.monotonic() - started, 1), results=rows,
        ).to_json(), indent=1) + "\n")
        print(f"\nresults: {out}\nlogs:    {work / 'logs'}\n"
              f"took {time.monotonic() - started:.0f}s")
    finally:
        if owned and not args.keep_sim:
            sim("down", "--dir", str(simdir))
            shutil.rmtree(simdir, ignore_errors=True)  # ~70 MiB per host
        elif owned:
            print(f"simulator left running: orchestrator sim down --dir {simdir}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
