"""A dry run leaves no trace (issue 24): `orchestrator plan` and `deploy --dry-run`, on a fresh
simulated box and on the same box converged by a real deploy, leave the file tree of each of its
hosts (the GPU container and its hypervisor) byte for byte as it was, caches included.

Compared, before and after each command: everything under SIMDIR/hosts/ (each host's root: HOME
with its caches, /opt, /tmp, /var/log, /etc/pve; beside the root, the box's simulated kernel ring
`kmsg`, its hardware `state.json` and the SSH host keys) and SIMDIR/python/ (the hosts' `python3`
and its site-packages), every entry by path, type, permission bits, size, mtime, the sha256 of a
file's bytes and a link's target. A file created and removed again shows as its directory's
mtime.

Not compared, and why:
* SIMDIR/hostenv/: the simulator's own code standing in for the GPU driver and kernel
  (`simhw`, `sitecustomize`, the `pynvml` stand-in); Python writes its __pycache__ there the
  first time a host's python imports it. On a real host there are no such files.
* SIMDIR/hub/ and SIMDIR/wheels/: the model hub and the package index, remote services.
* SIMDIR's own files (sim.json, sim.log, sim-config.json, the inventory, the client's key and
  known_hosts): the simulator daemon's bookkeeping and the operator's side.

One file inside may change, and only so: the SGLang server running on the converged box logs each
request it answers to its log (STATE_DIR/server.log), as the real server does (uvicorn's access
log; its /health runs a one-token generation, logged as a prefill batch). The checks' GETs add
such lines; the file must keep every byte it had and grow by nothing else.

FAILS until the agent stops writing its module code cache on a dry run: the first `plan` on a
fresh box writes ~/.cache/orchestrator-agent/*.code (orchestrator/remote/agent.py `_cache_store`,
`_keep_own_code`); the agent client is to tell the agent that the run is a dry run.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator_sim.fleet import SimFleet
from tests.runner.helpers import cli
from tests.sim.conftest import TEST_SCALE, assert_nothing_left

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(REPO / "playbooks/kimi-k2.6-eagle3.yaml")
#: what a dry run may add to the running server's log: its access log lines for GETs, and the
#: prefill of the one-token generation its /health runs
SERVER_LOG_LINE = re.compile(r'INFO: +[\d.]+:\d+ - "GET /[\w/?=&.-]* HTTP/1\.1" \d+ [\w ]+'
                             r"|\[[\d :.-]+ TP\d+\] Prefill batch, .*")
DRY_RUNS = (("plan",), ("deploy", "--dry-run"))

Entry = tuple[Any, ...]


def snapshot(*tops: Path) -> dict[str, Entry]:
    """Every entry under TOPS: path -> (type, mode, size, mtime, sha256 or link target)."""
    out: dict[str, Entry] = {}
    for top in tops:
        for dirpath, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                what: str | None = None
                if stat.S_ISREG(st.st_mode):
                    what = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                elif stat.S_ISLNK(st.st_mode):
                    what = os.readlink(path)
                out[path] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                             st.st_mtime_ns, what)
    return out


def changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    """What differs, one line per path."""
    return [f"{path}: {before.get(path)} -> {after.get(path)}"
            for path in sorted(before.keys() | after.keys()) if before.get(path) != after.get(path)]


class Box:
    """One simulated box (gpu-1 and its hypervisor pve-1) and the CLI run against it."""

    def __init__(self, fleet: SimFleet, work: Path) -> None:
        self.fleet = fleet
        self.work = work
        self.n = 0
        data = yaml.safe_load(Path(fleet.inventory_path).read_text())
        self.server_log = Path(data["hosts"]["gpu-1"]["vars"]["base_dir"]) / "run/server.log"

    def run(self, *args: str) -> None:
        self.n += 1
        r = cli(args[0], PLAYBOOK, "-i", str(self.fleet.inventory_path), *args[1:],
                runs=self.work / f"runs-{self.n}", timeout=300)
        assert r.code == 0, (args, r.stdout[-2000:], r.stderr[-2000:])

    def tree(self) -> dict[str, Entry]:
        return snapshot(self.fleet.simdir / "hosts", self.fleet.simdir / "python")

    def assert_no_trace(self, args: tuple[str, ...]) -> None:
        before = self.tree()
        log_before = self.server_log.read_bytes() if self.server_log.exists() else None
        self.run(*args)
        after = self.tree()
        if log_before is not None:  # the running server's own request log (module docstring)
            log_after = self.server_log.read_bytes()
            assert log_after.startswith(log_before), args
            added = log_after[len(log_before):].decode().splitlines()
            assert [line for line in added if not SERVER_LOG_LINE.fullmatch(line)] == [], args
            before.pop(str(self.server_log))
            after.pop(str(self.server_log))
        found = changes(before, after)
        assert found == [], f"{' '.join(args)} changed the hosts' files:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    work = tmp_path_factory.mktemp("dry-trace")
    fleet = SimFleet.up(work / "sim", hosts=1, time_scale=TEST_SCALE)
    try:
        yield Box(fleet, work)
    finally:
        pid = fleet.info().get("pid")
        fleet.down()
        assert_nothing_left(fleet.simdir, pid)


@pytest.mark.slow
def test_a_dry_run_on_a_fresh_box_leaves_no_trace(box: Box) -> None:
    for args in DRY_RUNS:
        box.assert_no_trace(args)


@pytest.mark.slow
def test_a_dry_run_on_a_converged_box_leaves_no_trace(box: Box) -> None:
    box.run("deploy")
    assert box.server_log.exists()
    for args in DRY_RUNS:
        box.assert_no_trace(args)
