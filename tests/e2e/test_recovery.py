"""Reboot recovery end to end: the K2.6 + EAGLE-3 deploy against a simulated box that is
power-cycled (`reboot` fault: SSH down, every process killed, /tmp wiped, the nvidia-uvm major
re-rolled while the container's cgroup keeps the old one) before, between and DURING stages.

After every reboot the SAME deploy command must bring the service back, changing only what the
reboot broke. Mid-stage reboots are fired from the test while a deploy runs in a subprocess: on
the host's own state (a pip process installing into the venv, a `.incomplete` download growing)
or on the run's events (wait_ready polling a loading server).

Default run (~70 s): a reboot during the model load (wait_ready polling) on the as-found box's
first deploy, a reboot after a converged deploy, a deploy started while the box is still down
(--wait-for-host), and the staging/prod inventories. `pytest -m soak tests/e2e/test_recovery.py`
adds the reboots during pip install and during a download, and a 4-host fleet with one box
rebooted mid-deploy.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from orchestrator_sim import procs
from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.hubrepos import add_repo, eagle3_config, eagle3_files, git_blob_sha1
from tests.runner.helpers import CliRun, cli, write_yaml
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")
PROFILE = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())
SCALE = 0.001  # the nominal 960 s load takes ~1 s
HOST = "gpu-1"
# What a reboot breaks on a converged box, and what it must leave alone.
BROKEN_BY_REBOOT = ("health", "server", "ready")
UNTOUCHED_BY_REBOOT = ("venv", "packages", "target", "drafter", "inspect")
BIG_REPO = "sim/eagle3-reboot-big"
BIG_MIB = 256  # a drafter whose weight file takes long enough to download to be interrupted

T = TypeVar("T")


def parse_ts(ts: str) -> float:
    """Event timestamp (ISO 8601, UTC, 'Z') -> epoch seconds."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class RunningDeploy:
    """The real CLI deploying in a subprocess; the test watches it and fires faults meanwhile."""

    def __init__(self, args: list[str], runs: Path, log: Path) -> None:
        self.runs = runs
        self.log = log
        runs.mkdir(parents=True, exist_ok=True)
        self._out = open(log, "w")  # noqa: SIM115 - closed in finish()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "deploy", *args],
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "ORCHESTRATOR_RUN_DIR": str(runs)}, start_new_session=True)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for path in self.runs.glob("*/events.jsonl"):
            for line in path.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # the line being written
        return out

    def wait_until(self, what: str, probe: Callable[[], T | None], timeout: float = 90.0,
                   interval: float = 0.005) -> T:
        """Poll `probe` until it returns something true; fail if the deploy ends first."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"the deploy ended (exit {self.proc.returncode}) before "
                                     f"{what}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout:.0f}s:\n"
                                     f"{self.log.read_text()[-3000:]}")
            time.sleep(interval)

    def finish(self, timeout: float = 180) -> CliRun:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        latest = self.runs / "latest"
        run_dir = latest.resolve() if latest.exists() else None
        return CliRun(code, self.log.read_text(), "", run_dir)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._out.close()


class Box:
    """One simulated box (GPU container + hypervisor) and ways to deploy to it."""

    def __init__(self, fleet: SimFleet, work: Path, host: str = HOST) -> None:
        self.fleet = fleet
        self.work = work
        self.host = host
        self.inventory = fleet.inventory_path
        self.data = yaml.safe_load(Path(self.inventory).read_text())
        self.n = 0
        self.running: list[RunningDeploy] = []
        self.scratch: list[Path] = []  # big files removed at teardown
        self.partial_download: Path | None = None
        self.converged_with: str | None = None  # overrides of the last deploy that reached ready

    # ---------------------------------------------------------------- paths on the host
    @property
    def hostvars(self) -> dict[str, Any]:
        return self.data["hosts"][self.host]["vars"]

    @property
    def base_dir(self) -> Path:
        return Path(self.hostvars["base_dir"])

    @property
    def venv(self) -> Path:
        return self.base_dir / "venvs" / f"sglang-{PROFILE['sglang_version']}"

    def site_packages(self) -> Path:
        found = sorted(self.venv.glob("lib/python3*/site-packages"))
        assert found, f"no site-packages in {self.venv}"
        return found[0]

    def model_dir(self, repo: str) -> Path:
        return self.base_dir / "models" / repo.replace("/", "--")

    def server_pid(self) -> int | None:
        try:
            pid = int(json.loads((self.base_dir / "run" / "server.pid").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None
        return pid if procs.alive(pid) else None

    # ---------------------------------------------------------------- deploys
    def _inventory(self, overrides: dict[str, Any] | None) -> str:
        if not overrides:
            return str(self.inventory)
        data = copy.deepcopy(self.data)
        data["hosts"][self.host]["vars"].update(overrides)
        return str(write_yaml(self.work / f"inv-{self.n}.yaml", data))

    def deploy(self, *args: str, overrides: dict[str, Any] | None = None) -> CliRun:
        self.n += 1
        inv = self._inventory(overrides)
        r = cli("deploy", PLAYBOOK, "-i", inv, *args, runs=self.work / f"runs-{self.n}",
                timeout=240)
        self.converged_with = json.dumps(overrides or {}, sort_keys=True) if r.code == 0 else None
        return r

    def current_overrides(self) -> dict[str, Any]:
        """The overrides the box last converged with ({} if none): keeps its launch as is."""
        return json.loads(self.converged_with) if self.converged_with else {}

    def ensure_converged(self) -> dict[str, Any]:
        """The overrides of a deploy that converged this box, deploying the plain inventory
        if there is none (keeping the launch as it is spares a server restart)."""
        if self.converged_with is None or self.server_pid() is None:
            assert_ready(self.deploy())
        assert self.converged_with is not None
        return json.loads(self.converged_with)

    def start(self, *args: str, overrides: dict[str, Any] | None = None) -> RunningDeploy:
        self.n += 1
        inv = self._inventory(overrides)
        run = RunningDeploy([PLAYBOOK, "-i", inv, *args], self.work / f"runs-{self.n}",
                            self.work / f"deploy-{self.n}.log")
        self.running.append(run)
        return run

    def reboot(self, down_seconds: float = 1.0, wait: bool = True,
               host: str | None = None) -> dict[str, Any]:
        return self.fleet.fault(host or self.host, "reboot", down_seconds=down_seconds,
                                wait=wait)

    # ---------------------------------------------------------------- what runs on the host
    def host_commands(self, host: str | None = None) -> list[str]:
        marker = self.fleet.host(host or self.host)["marker"]
        out = []
        for pid in procs.marked(value=marker):
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            out.append(raw.replace(b"\0", b" ").decode(errors="replace"))
        return out

    def ssh_ok(self, command: str) -> str:
        res = self.fleet.ssh(self.host, command, timeout=60)
        assert res.returncode == 0, f"{command!r}: rc={res.returncode}\n{res.stdout}{res.stderr}"
        return res.stdout


def make_as_found(fleet: SimFleet, host: str = HOST) -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts/sim_as_found.py"), str(fleet.simdir), host],
        capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr


def stop_fleet(fleet: SimFleet) -> None:
    pid = fleet.info().get("pid")
    fleet.down()
    assert_nothing_left(fleet.simdir, pid)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    work = tmp_path_factory.mktemp("recovery")
    fleet = SimFleet.up(work / "sim", hosts=1, time_scale=SCALE)
    b = Box(fleet, work)
    try:
        make_as_found(fleet)
        yield b
    finally:
        for run in b.running:
            run.kill()
        stop_fleet(fleet)
        for path in b.scratch:
            shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------ assertions


def assert_ready(r: CliRun, host: str = HOST) -> None:
    assert r.code == 0, r.stdout[-4000:] + r.stderr
    facts = r.summary["hosts"][host]["facts"]
    assert facts["ready"]["accept_length"] > 1.2


def assert_only_reboot_damage_repaired(r: CliRun, new_major: int, box: Box) -> None:
    """The recovery deploy redid health (uvm fix), server and ready, and nothing else."""
    st = r.statuses(box.host)
    for stage in BROKEN_BY_REBOOT:
        assert st[stage] == "changed", (stage, st)
    for stage in UNTOUCHED_BY_REBOOT:
        assert st[stage] == "ok", (stage, st)
    applied = {e["stage"] for e in r.events if e["event"] == "stage.apply"}
    assert applied == set(BROKEN_BY_REBOOT)
    assert_uvm_fixed(r, new_major, box)


def assert_uvm_fixed(r: CliRun, new_major: int, box: Box) -> None:
    """health found the re-rolled uvm major refused and fixed it through the hypervisor."""
    health = r.summary["hosts"][box.host]["stages"]["health"]
    assert health["status"] == "changed", health
    assert f"does not allow major {new_major}" in health["reason"], health["reason"]
    assert r.summary["hosts"][box.host]["facts"]["health"]["uvm_fix"]["backup"]
    spec = box.data["hosts"][box.host]["hypervisor"]
    conf = Path(box.fleet.host(spec["host"])["root"]) / "etc/pve/lxc" / f"{spec['ctid']}.conf"
    assert f"lxc.cgroup2.devices.allow: c {new_major}:* rwm" in conf.read_text()


def assert_cut(r: CliRun, stage: str, host: str = HOST) -> None:
    """The reboot hit `stage` of this run: the stage failed, or was retried, because the
    connection was lost or the server it waited for was gone. The runner then noticed the new
    boot id and walked the host's stages again (the health check the reboot invalidated runs
    again and repairs uvm), so the run itself usually ends ready; if it does not, the same
    deploy afterwards must (the callers check that)."""
    errors = [str(e.get("error")) for e in r.events if e.get("host") == host
              and e.get("stage") == stage and (e["event"] == "stage.retry" or (
                  e["event"] == "stage.end" and e["status"] == "failed"))]
    assert any("connection lost" in x or "is gone" in x for x in errors), (stage, errors)
    if r.code == 0:
        assert any(e["event"] == "host.rebooted" and e.get("host") == host for e in r.events)
        assert r.statuses(host)["ready"] == "changed"
    else:
        assert r.code in (1, 3), r.stdout[-3000:]
        assert r.statuses(host)["ready"] in ("failed", "skipped")


def assert_venv_whole(box: Box) -> None:
    """No half-installed venv: pip check passes, the packages import at the pinned versions,
    no pip rollback stash (~name dirs) and no dist-info without its RECORD."""
    py = box.venv / "bin" / "python"
    box.ssh_ok(f"{py} -m pip check")
    out = box.ssh_ok(
        f"{py} -c 'import json, sglang, compressed_tensors, huggingface_hub; "
        "import importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
        "(\"sglang\", \"compressed-tensors\", \"huggingface_hub\")}))'")
    versions = json.loads(out.strip().splitlines()[-1])
    assert versions == {"sglang": PROFILE["sglang_version"], "compressed-tensors": "0.18.0",
                        "huggingface_hub": "2.4.0"}, versions
    sp = box.site_packages()
    assert not [p.name for p in sp.iterdir() if p.name.startswith("~")]
    for dist in sp.glob("*.dist-info"):
        assert (dist / "RECORD").is_file() and (dist / "METADATA").is_file(), dist


def assert_download_verified(box: Box, repo: str) -> None:
    """Every file of the verified commit is on the host, byte for byte the hub's, and the
    hf_download manifest records the hub's hashes."""
    local = box.model_dir(repo)
    manifest = json.loads((local / ".orchestrator" / "manifest.json").read_text())
    assert manifest["repo"] == repo
    hub_commit = box.fleet.simdir / "hub" / repo / "commits" / manifest["commit"]
    expected = {p.relative_to(hub_commit).as_posix(): p for p in hub_commit.rglob("*")
                if p.is_file()}
    assert {f["path"] for f in manifest["files"]} == set(expected)
    for entry in manifest["files"]:
        want = expected[entry["path"]].read_bytes()
        got = (local / entry["path"]).read_bytes()
        assert len(got) == entry["size"] == len(want), entry["path"]
        assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest(), entry["path"]
        algo, digest = entry["hash"].split(":", 1)
        if algo == "sha256":
            assert digest == hashlib.sha256(want).hexdigest(), entry["path"]
        else:
            assert (algo, digest) == ("git-sha1", git_blob_sha1(want)), entry["path"]


def assert_recovered(cut: CliRun, r: CliRun, box: Box, new_major: int) -> None:
    """After a mid-stage reboot: the cut run itself (walking the host again once it saw the
    new boot id) or the same deploy afterwards ends ready with uvm fixed, every stage ok or
    changed, server and ready redone; the deploy after it is ready too; the venv is whole."""
    assert r.code == 0, r.stdout[-4000:] + r.stderr
    fixer = cut if cut.code == 0 else r
    assert_ready(fixer)
    st = fixer.statuses(box.host)
    assert set(st.values()) <= {"ok", "changed"}, st
    assert st["server"] == "changed" and st["ready"] == "changed", st
    assert_uvm_fixed(fixer, new_major, box)
    if fixer is cut:
        assert set(r.statuses(box.host).values()) == {"ok"}, r.statuses(box.host)
    assert_venv_whole(box)


# ------------------------------------------------------------------------------ default run


def slow_load(seconds: float = 7.0) -> dict[str, Any]:
    """Host vars for a model load of `seconds` (the simulated SGLang's knob, in its launch
    environment): longer than sglang_server's 5 s verify window, so wait_ready polls it."""
    launch = copy.deepcopy(PROFILE["launch"])
    launch["env"] = {**launch["env"], "SGLANG_SIM_LOAD_SECONDS": str(round(seconds / SCALE))}
    return {"launch": launch}


def test_reboot_during_the_model_load_then_the_same_deploy_recovers(box: Box) -> None:
    overrides = slow_load()
    run = box.start(overrides=overrides)
    polls = run.wait_until(
        "wait_ready polling the loading server",
        lambda: [e for e in run.events()
                 if e["event"] == "stage.progress" and e.get("stage") == "ready"],
        timeout=150)
    assert "loading" in polls[0]["message"], polls[0]
    fault = box.reboot()
    cut = run.finish()
    assert_cut(cut, "ready")
    assert cut.statuses(HOST)["server"] == "changed"  # it started; the load was cut

    r = box.deploy(overrides=overrides)
    assert_recovered(cut, r, box, fault["uvm_major"])
    if cut.code != 0:  # repaired by the second deploy: it redid only what the reboot broke
        assert_only_reboot_damage_repaired(r, fault["uvm_major"], box)
    fixer = cut if cut.code == 0 else r
    assert fixer.summary["hosts"][HOST]["facts"]["ready"]["server_up_s"] >= 6.5  # a full load
    for repo in (PROFILE["target"]["repo"], PROFILE["drafter"]["repo"]):
        assert_download_verified(box, repo)


def test_reboot_of_a_converged_box_then_the_same_deploy_changes_only_what_it_broke(
    box: Box,
) -> None:
    overrides = box.ensure_converged()
    old_pid = box.server_pid()
    rebooted_at = time.time()
    fault = box.reboot()
    assert box.server_pid() is None  # the reboot killed the server
    r = box.deploy(overrides=overrides)
    assert_ready(r)
    assert_only_reboot_damage_repaired(r, fault["uvm_major"], box)
    new_pid = box.server_pid()
    assert new_pid is not None and new_pid != old_pid
    # the kernel caches beside the venv survived the reboot: the capture compiled nothing
    cache = box.venv.parent / "kernel-cache" / f"sglang-{PROFILE['sglang_version']}"
    assert [f for f in (cache / "triton").iterdir() if f.stat().st_mtime < rebooted_at]
    phases = {p["phase"]: p for p in r.summary["hosts"][HOST]["facts"]["ready"]["load_timeline"]}
    assert float(phases["cuda graph capture"]["detail"].split()[0]) < 100  # warm (cold: 300)


def test_deploy_while_the_box_is_down_waits_for_ssh_then_completes(box: Box) -> None:
    overrides = box.ensure_converged()
    # down long enough for the short deploy below to start and find it down on a loaded machine
    # (8 s was not, under twice the suite's own load)
    fault = box.reboot(down_seconds=12.0, wait=False)
    waiting = box.start("--wait-for-host", "60s", overrides=overrides)
    # meanwhile, with a short wait the host is reported unreachable and nothing runs
    short = box.deploy("--wait-for-host", "0.5s", overrides=overrides)
    assert short.code == 3, short.stdout[-3000:]
    assert set(short.statuses(HOST).values()) == {"skipped"}
    assert "UNREACHABLE" in short.stdout + short.stderr  # the console is on stderr
    # the longer wait rides out the rest of the reboot
    r = waiting.finish()
    assert_ready(r)
    assert "waiting for SSH" in r.stdout
    waits = [e for e in r.events if e["event"] == "host.waiting"]
    assert waits and "refused" in waits[0]["error"]
    connected = next(e for e in r.events if e["event"] == "host.connected")
    assert parse_ts(waits[-1]["ts"]) <= parse_ts(connected["ts"])
    assert parse_ts(connected["ts"]) >= fault["up_at"] - 0.5  # not before the box was back
    assert_only_reboot_damage_repaired(r, fault["uvm_major"], box)
    box.converged_with = json.dumps(overrides, sort_keys=True)


@pytest.mark.parametrize("name", ["staging", "prod"])
def test_staging_and_prod_inventories_validate_with_the_same_playbook(
    name: str, tmp_path: Path
) -> None:
    inventory = REPO / "configs" / "inventory" / f"{name}.yaml"
    r = cli("validate", PLAYBOOK, "-i", str(inventory), runs=tmp_path / "runs", timeout=60)
    assert r.code == 0, r.stderr
    data = yaml.safe_load(inventory.read_text())
    gpu_hosts = data["groups"]["gpu"]["hosts"]
    assert gpu_hosts
    for host in gpu_hosts:  # each GPU container names the hypervisor that repairs it
        hv = data["hosts"][host]["hypervisor"]
        assert hv["host"] in data["hosts"] and hv["ctid"] >= 1
    text = inventory.read_text()
    assert "--locked runs/<staging-run>/deploy.lock.json -i configs/inventory/prod.yaml" in text


# ------------------------------------------------------------------------------ soak


@pytest.mark.soak
def test_reboot_during_pip_install_then_the_same_deploy_recovers(box: Box) -> None:
    py = box.venv / "bin" / "python"
    if box.fleet.ssh(box.host, f"{py} -m pip --version").returncode == 0:
        # not the as-found box any more: take every package out so pip installs them all
        box.ssh_ok(f"{py} -m pip freeze --exclude-editable | grep -v '^-e' | "
                   f"{py} -m pip uninstall -y -q -r /dev/stdin || true")
    overrides = box.current_overrides()
    run = box.start(overrides=overrides)
    pip_seen = run.wait_until(
        "pip install on the host",
        lambda: [c for c in box.host_commands() if " -m pip install " in c], timeout=120)
    assert "sglang==" in pip_seen[0]
    sp = box.site_packages()
    before = set(os.listdir(sp))
    polls = [0]

    def installing() -> bool:
        polls[0] += 1
        if set(os.listdir(sp)) - before:
            return True
        return polls[0] % 20 == 0 and not any(" -m pip install " in c
                                              for c in box.host_commands())

    run.wait_until("pip writing into the venv", installing, interval=0.002)
    fault = box.reboot()
    cut = run.finish()
    assert_cut(cut, "packages")

    r = box.deploy(overrides=overrides)
    assert_recovered(cut, r, box, fault["uvm_major"])
    # pip ran again, to completion: in the cut run's retry or in this deploy
    redone = [x.statuses(HOST)["packages"] for x in (cut, r)]
    assert "changed" in redone, redone
    for repo in (PROFILE["target"]["repo"], PROFILE["drafter"]["repo"]):
        assert_download_verified(box, repo)


def _big_drafter(box: Box) -> dict[str, str]:
    """A drafter repo on the simulated hub with a BIG_MIB weight file (valid safetensors)."""
    files = eagle3_files(BIG_REPO, eagle3_config(), weights_seed=BIG_REPO)
    n = BIG_MIB << 20
    header = json.dumps({"__metadata__": {"format": "pt"}, "midlayer.stand_in": {
        "dtype": "U8", "shape": [n], "data_offsets": [0, n]}}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    block = hashlib.shake_256(BIG_REPO.encode()).digest(1 << 20)
    files["model.safetensors"] = struct.pack("<Q", len(header)) + header + block * BIG_MIB
    hub = box.fleet.simdir / "hub"
    add_repo(hub, BIG_REPO, [files])
    box.scratch += [hub / BIG_REPO, box.model_dir(BIG_REPO)]
    return {"repo": BIG_REPO, "revision": "main", "architecture": "LlamaForCausalLMEagle3"}


@pytest.mark.soak
def test_reboot_during_the_drafter_download_then_the_same_deploy_recovers(box: Box) -> None:
    overrides = {**box.current_overrides(), "drafter": _big_drafter(box)}
    local = box.model_dir(BIG_REPO)
    shutil.rmtree(local, ignore_errors=True)
    run = box.start(overrides=overrides)

    def partial() -> list[Path]:
        return [p for p in local.glob(".cache/huggingface/download/**/*.incomplete")
                if p.exists() and p.stat().st_size >= 16 << 20]

    run.wait_until("a partial download of the drafter", partial, timeout=150)
    fault = box.reboot()
    cut = run.finish()
    assert_cut(cut, "drafter")

    r = box.deploy(overrides=overrides)
    assert_recovered(cut, r, box, fault["uvm_major"])
    # the drafter was downloaded again and verified: in the cut run's retry or in this deploy
    redone = [x.statuses(HOST)["drafter"] for x in (cut, r)]
    assert "changed" in redone, redone
    assert any(x.summary["hosts"][HOST]["facts"].get("drafter", {}).get("bytes", 0)
               > BIG_MIB << 20 for x in (cut, r))
    assert_download_verified(box, BIG_REPO)
    assert_download_verified(box, PROFILE["target"]["repo"])
    box.partial_download = local


@pytest.mark.soak
def test_a_download_cut_by_a_reboot_leaves_no_partial_file(box: Box) -> None:
    if box.partial_download is None:
        pytest.skip("needs test_reboot_during_the_drafter_download_then_the_same_deploy_recovers")
    left = list(box.partial_download.glob(".cache/huggingface/download/**/*.incomplete"))
    assert not left, f"left behind: {[p.name for p in left]}"


@pytest.mark.soak
def test_fleet_of_four_one_rebooted_mid_deploy_the_others_finish_and_a_rerun_completes(
    tmp_path: Path,
) -> None:
    fleet = SimFleet.up(tmp_path / "sim", hosts=4, time_scale=SCALE)
    fleet_box = Box(fleet, tmp_path)
    hosts = [f"gpu-{i}" for i in range(1, 5)]
    victim = "gpu-2"
    try:
        run = fleet_box.start()
        run.wait_until(
            f"the server stage on {victim}",
            lambda: [e for e in run.events() if e["event"] == "stage.start"
                     and e.get("host") == victim and e.get("stage") == "server"],
            timeout=240, interval=0.05)
        time.sleep(1.0)  # the server stage is checking, launching or watching the new server
        fault = fleet_box.reboot(host=victim)
        first = run.finish(timeout=300)
        assert first.code in (0, 1, 3), first.stdout[-4000:]
        if first.code != 0:
            assert first.statuses(victim)["ready"] in ("failed", "skipped")
        pids = {}
        for host in hosts:
            if host == victim:
                continue
            st = first.statuses(host)
            assert set(st.values()) <= {"changed", "ok"}, (host, st)
            assert st["ready"] == "changed", (host, st)
            pidfile = Path(fleet.host(host)["root"]) / "opt/orchestrator/run/server.pid"
            pids[host] = json.loads(pidfile.read_text())["pid"]

        rerun = cli("deploy", PLAYBOOK, "-i", str(fleet.inventory_path),
                    runs=tmp_path / "runs-rerun", timeout=300)
        assert rerun.code == 0, rerun.stdout[-4000:]
        st = rerun.statuses(victim)
        assert set(st.values()) <= {"changed", "ok"}, st
        # whichever run repaired it (the first, walking the host again after its reboot, or
        # this one), health found the new uvm major refused and fixed it
        fixed_by = rerun if first.code != 0 else first
        assert fixed_by.statuses(victim)["ready"] == "changed", fixed_by.statuses(victim)
        health = fixed_by.summary["hosts"][victim]["stages"]["health"]
        assert health["status"] == "changed"
        assert f"does not allow major {fault['uvm_major']}" in health["reason"]
        for host in hosts:
            if host == victim:
                continue
            assert set(rerun.statuses(host).values()) == {"ok"}, (host, rerun.statuses(host))
            pidfile = Path(fleet.host(host)["root"]) / "opt/orchestrator/run/server.pid"
            assert json.loads(pidfile.read_text())["pid"] == pids[host]  # left running
        status = cli("status", "-i", str(fleet.inventory_path), "--limit", "gpu", "--json",
                     runs=tmp_path / "runs-status")
        assert status.code == 0, status.stderr
        rows = {row["host"]: row for row in json.loads(status.stdout)}
        assert sorted(rows) == hosts
        for row in rows.values():
            assert row["ready"] is True and row["state"] == "running", row
            assert row["accept_length"] > 1.2, row
    finally:
        for r in fleet_box.running:
            r.kill()
        stop_fleet(fleet)
