"""Secrets never leak: canary tokens are searched in everything the tool writes or prints.

Three canaries: the Hugging Face token (HF_TOKEN, read by `!env`), the SGLang API key
(SGLANG_API_KEY) and a variable listed under the inventory's `secrets:` (a credential inside the
package index URL, a name that does not look secret). They are searched, for a SUCCESSFUL deploy
of playbooks/kimi-k2.6-eagle3.yaml on a simulated host (the hub gated: `hub-gated` fault on, the
hub accepting only the canary token, so the token is really used) followed by `status` and
`logs`, and for a FAILING deploy (a stage whose command prints all three and exits 3, a pip
install that fails with the credential in its index URL), in:

* the console (stdout and stderr of every command), the run records (events.jsonl,
  summary.json, deploy.lock.json) and any crash log;
* every file on the simulated hosts (state dir: launch spec, fingerprint, pid file, unit,
  server log; venvs, models, caches, HOME) and of the simulator;
* /proc/*/cmdline of every process on the machine, sampled every few milliseconds during each
  command and once after (the server still runs).

The canary may be only where it must be: the API key in the 0600 key file of the state dir (and
in process environments, which are not searched). The simulator's own configuration holds the
hub's token (that is the hub, not the tool) and must be 0600 too.
"""

from __future__ import annotations

import copy
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_sim.fleet import SimFleet
from tests.runner.helpers import CliRun, cli, write_yaml
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")
SCALE = 0.001


@dataclass(frozen=True)
class Canaries:
    """The three secret values (random per run, so that nothing else can hold them)."""

    hf: str = field(default_factory=lambda: "hf_CanaryHF" + secrets.token_hex(12))
    key: str = field(default_factory=lambda: "sk-CanaryKEY" + secrets.token_hex(12))
    var: str = field(default_factory=lambda: "CanaryVAR" + secrets.token_hex(12))

    def all(self) -> dict[str, bytes]:
        return {"HF token": self.hf.encode(), "API key": self.key.encode(),
                "secret var": self.var.encode()}


class CmdlineWatch:
    """Samples /proc/*/cmdline of every process while running; remembers any canary hit."""

    def __init__(self, needles: dict[str, bytes]) -> None:
        self.needles = needles
        self.hits: dict[int, tuple[str, str]] = {}
        self.sweeps = 0
        self.processes_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sweep(self) -> None:
        # os.open/os.read, not open(): a third less CPU per sweep (hundreds of processes, every
        # few milliseconds, on a machine the other test workers share)
        me = str(os.getpid())
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or entry == me:
                continue
            try:
                fd = os.open(f"/proc/{entry}/cmdline", os.O_RDONLY)
            except OSError:
                continue
            try:
                cmd = b""
                while chunk := os.read(fd, 65536):
                    cmd += chunk
            except OSError:
                continue
            finally:
                os.close(fd)
            self.processes_seen.add(int(entry))
            for what, needle in self.needles.items():
                if needle in cmd:
                    self.hits[int(entry)] = (what, cmd.replace(b"\0", b" ").decode(
                        errors="replace")[:300])
        self.sweeps += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sweep()
            self._stop.wait(0.005)

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Deployed:
    """The simulated box after the deploys, and everything the commands printed."""

    fleet: SimFleet
    work: Path
    canaries: Canaries
    runs: dict[str, CliRun]
    watch: CmdlineWatch
    state_dir: Path


def _inventory(fleet: SimFleet, work: Path, c: Canaries) -> Path:
    data = yaml.safe_load(Path(fleet.inventory_path).read_text())
    data = copy.deepcopy(data)
    hv = data["hosts"]["gpu-1"]["vars"]
    index = hv["pip_index_url"]
    scheme, rest = index.split("://", 1)
    # a credential inside the index URL, from a var listed under `secrets:` (its name does
    # not look secret, so only the list protects it)
    hv["mirror_credential"] = c.var
    hv["pip_index_url"] = f"{scheme}://deploy:{{{{ mirror_credential }}}}@{rest}"
    data["secrets"] = ["mirror_credential"]
    return write_yaml(work / "inventory.yaml", data)


def _failing_playbook(work: Path) -> Path:
    text = """\
name: leaky-failure
vars:
  hf_token: !env HF_TOKEN
  api_key: !env SGLANG_API_KEY
secrets: [hf_token, api_key]
hosts: gpu
stages:
  - id: leak
    run: echo "token $T"; echo "key $K" >&2; echo "var $V"; printf '%s\\n' "$T$K$V"; exit 3
    env: {T: "{{ hf_token }}", K: "{{ api_key }}", V: "{{ mirror_credential }}"}
  - id: pip
    uses: pip_install
    with:
      python: "{{ base_dir }}/venvs/sglang-0.5.23/bin/python"
      index_url: "{{ pip_index_url }}"
      requirements: ["no-such-package-canary==1.0"]
"""
    path = work / "failing.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    work = tmp_path_factory.mktemp("secrets")
    c = Canaries()
    env = {"HF_TOKEN": c.hf, "SGLANG_API_KEY": c.key}
    runs: dict[str, CliRun] = {}
    with CmdlineWatch(c.all()) as watch:
        fleet = SimFleet.up(work / "sim", hosts=1, time_scale=SCALE, hf_token=c.hf)
        try:
            fleet.fault("gpu-1", "hub-gated")
            inv = _inventory(fleet, work, c)
            runs["deploy"] = cli("deploy", PLAYBOOK, "-i", str(inv), runs=work / "runs",
                                 env=env, timeout=300)
            runs["status"] = cli("status", "-i", str(inv), "--json", runs=work / "runs-status",
                                 env=env, timeout=60)
            runs["logs"] = cli("logs", "-i", str(inv), "-n", "400", runs=work / "runs-logs",
                               env=env, timeout=60)
            runs["failing"] = cli("deploy", str(_failing_playbook(work)), "-i", str(inv),
                                  runs=work / "runs-fail", env=env, timeout=120)
            watch.sweep()  # after: the server still runs
            base = Path(yaml.safe_load(inv.read_text())["hosts"]["gpu-1"]["vars"]["base_dir"])
            yield Deployed(fleet, work, c, runs, watch, base / "run")
        finally:
            pid = fleet.info().get("pid")
            fleet.down()
            assert_nothing_left(fleet.simdir, pid)


# -- the deploys did what they should ------------------------------------------------------------


def test_the_gated_deploy_succeeds_with_the_token_and_the_failing_one_fails(
    deployed: Deployed,
) -> None:
    r = deployed.runs["deploy"]
    assert r.code == 0, r.stdout + r.stderr
    st = r.statuses("gpu-1")
    assert st["target"] == "changed" and st["drafter"] == "changed" and st["ready"] == "changed"
    assert deployed.runs["status"].code == 0, deployed.runs["status"].stderr
    logs = deployed.runs["logs"]
    assert logs.code == 0 and "server_args" in logs.stdout and "***" in logs.stdout, logs.stderr
    f = deployed.runs["failing"]
    assert f.code == 1
    stages = f.summary["hosts"]["gpu-1"]["stages"]
    assert stages["leak"]["status"] == "failed" and stages["pip"]["status"] == "failed"
    # the failure is explained with the command's output, masked
    assert "token ***" in stages["leak"]["error"] and "var ***" in stages["leak"]["error"]
    assert "token ***" in f.stdout + f.stderr


# -- nowhere but where it must be ----------------------------------------------------------------


def _hits(data: bytes, needles: dict[str, bytes]) -> list[str]:
    return [what for what, needle in needles.items() if needle in data]


def test_console_records_and_error_messages_hold_no_secret(deployed: Deployed) -> None:
    needles = deployed.canaries.all()
    leaks = []
    for name, r in deployed.runs.items():
        for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
            for what in _hits(text.encode(), needles):
                leaks.append(f"{name} {stream}: {what}")
    records = [p for d in deployed.work.glob("runs*") for p in d.rglob("*") if p.is_file()]
    names = {p.name for p in records}
    assert {"events.jsonl", "summary.json", "deploy.lock.json"} <= names, names
    crash_logs = [p for p in Path("/tmp").glob("orchestrator-crash-*.log")
                  if p.stat().st_mtime >= deployed.fleet.simdir.stat().st_mtime]
    for path in records + crash_logs:
        for what in _hits(path.read_bytes(), needles):
            leaks.append(f"{path}: {what}")
    assert leaks == []


def test_files_on_the_hosts_hold_no_secret_but_the_0600_key_file(deployed: Deployed) -> None:
    needles = deployed.canaries.all()
    simdir = deployed.fleet.simdir
    key_file = deployed.state_dir / "api_key"
    sim_config = simdir / "sim-config.json"  # the simulator's own: the hub's token
    holding: dict[Path, list[str]] = {}
    scanned = 0
    for path in simdir.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        scanned += 1
        found = _hits(path.read_bytes(), needles)
        if found:
            holding[path] = found
    assert scanned > 1000  # venvs, models, state dir, logs: really everything
    for path, found in holding.items():
        assert path.stat().st_mode & 0o077 == 0, f"{path} holds {found} and is not 0600"
    assert holding.pop(key_file, None) == ["API key"]
    assert holding.pop(sim_config, None) == ["HF token"]
    assert holding == {}, f"secrets in files: {holding}"
    # what the brief names explicitly was there, and was searched
    for name in ("launch.json", "fingerprint.json", "server.log", "server.pid"):
        assert (deployed.state_dir / name).is_file(), name
    log = (deployed.state_dir / "server.log").read_text()
    assert "server_args" in log and "***" in log  # SGLang logs its args: the key is masked


def test_no_process_ever_had_a_secret_on_its_command_line(deployed: Deployed) -> None:
    w = deployed.watch
    assert w.sweeps > 100 and len(w.processes_seen) > 50  # it really watched
    assert w.hits == {}, f"secrets on command lines: {w.hits}"


def test_the_secret_reaches_what_needs_it(deployed: Deployed) -> None:
    # the HF token was really used: the gated hub served the checkpoints
    facts = deployed.runs["deploy"].summary["hosts"]["gpu-1"]["facts"]
    assert facts["target"]["files"] > 0 and facts["drafter"]["files"] > 0
    # the server holds the API key (in-process, from the key file), not on argv
    pid = int(facts["server"]["pid"])
    assert deployed.canaries.key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert (deployed.state_dir / "api_key").read_text().strip() == deployed.canaries.key


def test_a_secret_written_into_a_command_line_is_flagged(tmp_path: Path) -> None:
    """The one place the tool cannot keep a secret off argv: the author wrote it into `run:`.
    The deploy says so (console and events), and the output stays masked."""
    c = Canaries()
    pb = tmp_path / "inline.yaml"
    pb.write_text("name: inline\nvars:\n  hf_token: !env HF_TOKEN\nsecrets: [hf_token]\n"
                  "stages:\n  - id: inline\n    run: sleep 0.3; echo {{ hf_token }}\n"
                  "  - id: via-env\n    run: sleep 0.3; echo \"$T\"\n"
                  "    env: {T: \"{{ hf_token }}\"}\n")
    inv = write_yaml(tmp_path / "inv.yaml", {"hosts": {"localhost": {
        "connection": "local", "lock_path": str(tmp_path / "deploy.lock")}}})
    with CmdlineWatch(c.all()) as watch:
        r = cli("deploy", str(pb), "-i", str(inv), runs=tmp_path / "runs", env={"HF_TOKEN": c.hf})
    assert r.code == 0, r.stderr
    warned = [e for e in r.events if e["event"] == "secret_on_command_line"]
    assert [e["stage"] for e in warned] == ["inline"]  # not the stage that uses env:
    assert "secret_on_command_line" in r.stdout + r.stderr
    assert c.hf not in r.stdout + r.stderr + (r.run_dir / "events.jsonl").read_text()
    # what the warning is about: the inline stage's shell had it on its command line
    assert {what for what, _ in watch.hits.values()} == {"HF token"}
    assert all("sleep 0.3; echo" in cmd for _, cmd in watch.hits.values())
