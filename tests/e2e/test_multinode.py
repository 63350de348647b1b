"""Multi-node TP end to end: `orchestrator deploy playbooks/kimi-k2.6-eagle3-2node.yaml` over two
simulated 8-GPU boxes (TP 16: node 0 serves the API, node 1 a dummy /health), then a reboot of
either box, after which the same deploy launches the whole group again.

The boxes get their venv (the SGLang stand-in from the sim's index) and checkpoints' config.json
before the test, so the deploy runs only `health,server,ready` (the other stages are the
single-box tests' business); health repairs the nvidia-uvm rule a reboot breaks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_sim.fleet import SimFleet
from orchestrator_sim.hubrepos import eagle3_config, kimi_files
from tests.runner.helpers import CliRun, cli
from tests.sglang.simhost import _pip_env
from tests.sim.conftest import assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3-2node.yaml")
PROFILE = yaml.safe_load((REPO / "configs/models/kimi-k2.6.yaml").read_text())
SCALE = 0.001
STAGES = "health,server,ready"


class Pair:
    """Two simulated boxes prepared for the 2-node playbook."""

    def __init__(self, fleet: SimFleet, work: Path) -> None:
        self.fleet = fleet
        self.work = work
        inv = yaml.safe_load(Path(fleet.inventory_path).read_text())
        self.vars = {h: inv["hosts"][h]["vars"] for h in ("gpu-1", "gpu-2")}
        self.n = 0

    def base(self, host: str) -> Path:
        return Path(self.vars[host]["base_dir"])

    def provision(self) -> None:
        """The venv and both checkpoints' config.json on each box, as earlier stages leave them."""
        info = self.fleet.info()
        venv = self.base("gpu-1") / "venvs" / f"sglang-{PROFILE['sglang_version']}"
        subprocess.run([info["python"], "-m", "venv", "--without-pip", str(venv)], check=True,
                       env=_pip_env(), capture_output=True, timeout=120)
        pip = subprocess.run(
            [info["python"], "-m", "pip", "-q", "--python", str(venv / "bin" / "python"),
             "install", "--no-cache-dir", "--index-url", info["index_url"],
             f"sglang=={PROFILE['sglang_version']}", "compressed-tensors"],
            env=_pip_env(), capture_output=True, text=True, timeout=180)
        assert pip.returncode == 0, pip.stderr
        target = PROFILE["target"]["repo"].replace("/", "--")
        drafter = PROFILE["drafter"]["repo"].replace("/", "--")
        for host in ("gpu-1", "gpu-2"):
            models = self.base(host) / "models"
            for name, data in ((target, kimi_files()["config.json"]),
                               (drafter, json.dumps(eagle3_config()).encode())):
                (models / name).mkdir(parents=True, exist_ok=True)
                (models / name / "config.json").write_bytes(data)
            if host != "gpu-1":  # same absolute layout per box: copy, then fix the paths
                dest = self.base(host) / "venvs" / venv.name
                shutil.copytree(venv, dest, symlinks=True)
                for script in (dest / "bin").iterdir():
                    if script.is_file() and not script.is_symlink():
                        text = script.read_bytes().replace(bytes(venv), bytes(dest))
                        script.write_bytes(text)

    def playbook(self) -> str:
        """The 2-node playbook as shipped, but verify_window 0.5 s (5 s: a bad argument shows
        at once; at this time scale the start is over long before)."""
        path = self.work / "kimi-k2.6-eagle3-2node.yaml"
        if not path.exists():  # text edits: the playbook's `!env` tags stay as they are
            text = Path(PLAYBOOK).read_text().replace(
                "../configs/models/", f"{REPO}/configs/models/")
            anchor = "      nodes: \"{{ groups[node_group] }}\"\n"
            assert anchor in text
            path.write_text(text.replace(anchor, anchor + "      verify_window: 0.5\n"))
        return str(path)

    def deploy(self, *args: str) -> CliRun:
        self.n += 1
        return cli("deploy", self.playbook(), "-i", str(self.fleet.inventory_path),
                   "--only", STAGES, *args, runs=self.work / f"runs-{self.n}", timeout=180)

    def server(self, host: str) -> dict[str, Any] | None:
        """The recorded server (pid file) when its process is alive."""
        try:
            rec = json.loads((self.base(host) / "run" / "server.pid").read_text())
        except (OSError, ValueError):
            return None
        return rec if Path(f"/proc/{rec['pid']}").exists() else None

    def args(self, host: str) -> list[str]:
        return json.loads((self.base(host) / "run" / "launch.json").read_text())["argv"]

    def get(self, host: str, path: str) -> int:
        url = f"http://{self.vars[host]['sglang_host']}:{self.vars[host]['sglang_port']}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def wait_gone(self, host: str, timeout: float = 10.0) -> float:
        t0 = time.monotonic()
        while self.server(host) is not None:
            assert time.monotonic() - t0 < timeout, f"{host}'s server outlived its group"
            time.sleep(0.05)
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("2node")
    fleet = SimFleet.up(work / "sim", hosts=2, time_scale=SCALE)
    try:
        p = Pair(fleet, work)
        p.provision()
        yield p
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


def _statuses(r: CliRun) -> dict[tuple[str, str], str]:
    return {(h, s): v for h in ("gpu-1", "gpu-2") if h in r.summary["hosts"]
            for s, v in r.statuses(h).items()}


def test_two_boxes_deploy_one_tp16_group(pair: Pair) -> None:
    t0 = time.monotonic()
    r = pair.deploy()
    took = time.monotonic() - t0
    assert r.code == 0, r.stdout + r.stderr
    st = _statuses(r)
    assert st[("gpu-1", "server")] == st[("gpu-2", "server")] == "changed"
    node0 = pair.vars["gpu-1"]["sglang_host"]
    for rank, host in enumerate(("gpu-1", "gpu-2")):
        args = " ".join(pair.args(host))
        assert "--tp-size 16" in args
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr {node0}:20000" in args
    # node 0 serves the API, node 1 only a dummy /health (multinode.py)
    assert pair.get("gpu-1", "/v1/models") == 200
    assert pair.get("gpu-2", "/health") == 200 and pair.get("gpu-2", "/v1/models") == 404
    assert r.summary["hosts"]["gpu-1"]["facts"]["ready"]["accept_length"] > 1.2
    print(f"2-box first deploy (health, server, ready): {took:.1f}s")
    again = pair.deploy()  # converged: nothing relaunched, node 1 checked its group link
    assert again.code == 0, again.stdout + again.stderr
    assert set(_statuses(again).values()) == {"ok"}


@pytest.mark.parametrize("rebooted", ["gpu-2", "gpu-1"])
def test_one_box_reboots_the_whole_group_restarts(pair: Pair, rebooted: str) -> None:
    other = "gpu-1" if rebooted == "gpu-2" else "gpu-2"
    before = {h: pair.server(h) for h in ("gpu-1", "gpu-2")}
    if not all(before.values()):  # this test runs first on its worker (pytest -n without
        first = pair.deploy()     # --dist loadfile): deploy the group
        assert first.code == 0, first.stdout + first.stderr
        before = {h: pair.server(h) for h in ("gpu-1", "gpu-2")}
    assert all(before.values()), "the group is not running"
    pair.fleet.fault(rebooted, "reboot", down_seconds=0.5, wait=True)
    # one rank dying ends the group: the other box's rank exits by itself
    ended = pair.wait_gone(other)
    t0 = time.monotonic()
    r = pair.deploy()
    took = time.monotonic() - t0
    assert r.code == 0, r.stdout + r.stderr
    st = _statuses(r)
    assert st[("gpu-1", "server")] == st[("gpu-2", "server")] == "changed"
    assert st[(rebooted, "health")] == "changed"  # the reboot broke the nvidia-uvm rule
    after = {h: pair.server(h) for h in ("gpu-1", "gpu-2")}
    assert all(after.values())
    assert all(after[h]["pid"] != before[h]["pid"] for h in after)
    assert pair.get("gpu-1", "/health") == 200 and pair.get("gpu-2", "/health") == 200
    print(f"{rebooted} rebooted: {other}'s rank ended {ended:.2f}s later; the redeploy took "
          f"{took:.1f}s")


def test_node1_cannot_reach_node0_is_refused_before_launch(pair: Pair) -> None:
    """A dist-init address node 1 cannot reach (here: a name that does not resolve) is refused
    by the preflight on node 1, before anything is stopped or started."""
    before = pair.server("gpu-2")
    r = cli("deploy", pair.playbook(), "-i", str(pair.fleet.inventory_path), "--only",
            "server", "--limit", "gpu-2", "--var", "dist_init_addr=node0.invalid:20000",
            runs=pair.work / "runs-unreachable", timeout=120)
    assert r.code != 0
    assert "cannot reach node 0's dist-init address node0.invalid:20000" in r.stdout + r.stderr
    assert pair.server("gpu-2") == before  # untouched
