"""Nothing planted in the run directory is read back (issue 24: the pickled plan cache is gone).

The plan cache used to keep each run's rendered plan in RUN_DIR/.plan-cache/ and unpickle it on
the next run; whoever could write the run directory could plant an entry there and have it run on
the operator's machine. Here the directory holds a pickle that would create a marker file when
unpickled (under the name and header the cache used, and under the name of every entry a first
run left there), and `deploy`, `plan` and `deploy --dry-run` run under an audit hook (PEP 578)
that records every open of a path below .plan-cache/, every listing of it and every unpickled
global: none may happen, and the marker must not appear.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from tests.runner.helpers import local_inventory, write_yaml

#: the orchestrator's command line under an audit hook that notes what touches CACHE
HOOKED = r"""
import os, sys
log_path, cache = sys.argv[1], os.path.abspath(sys.argv[2])
log = open(log_path, "a")

def below(path):
    if isinstance(path, int):
        return False
    path = os.path.abspath(os.fsdecode(path))
    return path == cache or path.startswith(cache + os.sep)

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and below(args[0]):
        log.write(f"{event} {args[0]}\n")
    elif event == "pickle.find_class":
        log.write(f"unpickled {args[0]}.{args[1]}\n")
    else:
        return
    log.flush()

sys.addaudithook(hook)
sys.argv = ["orchestrator", *sys.argv[3:]]
from orchestrator.cli.main import entry
entry()
"""


class _Plant:
    """Unpickled, it runs `touch MARKER` (what a planted entry did)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _hooked(tmp_path: Path, log: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(cache.parent), "HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-c", HOOKED, str(log), str(cache), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_a_planted_plan_cache_entry_is_never_read_or_unpickled(tmp_path: Path) -> None:
    runs, marker, log = tmp_path / "runs", tmp_path / "PWNED", tmp_path / "audit.log"
    cache = runs / ".plan-cache"
    inv = local_inventory(tmp_path / "inv.yaml")
    pb = write_yaml(tmp_path / "pb.yaml", {"name": "p", "stages": [
        {"id": "a", "run": "true", "check": "true"}]})
    first = _hooked(tmp_path, log, cache, "deploy", str(pb), "-i", str(inv))
    assert first.returncode == 0, first.stderr
    payload = pickle.dumps(_Plant(marker))
    cache.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in cache.iterdir()} | {"plan-00000000000000000000.bin"}
    planted = b"orchestrator plan cache 1\n" + payload
    for name in names:  # whatever a first run left there, and the cache's own naming
        (cache / name).write_bytes(planted)
    for args in (["plan"], ["deploy", "--dry-run"], ["deploy"]):
        r = _hooked(tmp_path, log, cache, args[0], str(pb), "-i", str(inv), *args[1:])
        assert r.returncode == 0, (args, r.stderr)
    assert not marker.exists()
    assert not log.exists() or log.read_text() == ""
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == dict.fromkeys(names, planted)
