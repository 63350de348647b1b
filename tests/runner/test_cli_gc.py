"""`orchestrator deploy` turns the cyclic GC off while it prepares a run, then freezes what the
preparation made and turns collection back on for the run itself (cli.main._resume_gc), also
when the run fails early: a long deploy must never run without collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner.helpers import local_inventory, write_yaml

PROBE = """
import gc, sys
import orchestrator.cli.main as cli
seen = []
start = cli._resume_gc
def resume():
    seen.append(gc.isenabled())  # still off while the run was prepared
    start()
cli._resume_gc = resume
code = cli.main(sys.argv[1:])
print(code, seen, gc.isenabled(), gc.get_freeze_count())
"""


def _run(tmp_path: Path, playbook: dict) -> list[str]:
    pb = write_yaml(tmp_path / "pb.yaml", playbook)
    inv = local_inventory(tmp_path / "inv.yaml")
    p = subprocess.run(
        [sys.executable, "-c", PROBE, "deploy", str(pb), "-i", str(inv),
         "--run-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    return p.stdout.split("\n")[-2].split(" ", 2)


def test_collection_is_back_on_once_the_run_starts_and_startup_is_frozen(tmp_path: Path,
                                                                          ) -> None:
    code, seen, rest = _run(tmp_path, {"name": "p", "stages": [{"id": "a", "run": "true"}]})
    enabled, frozen = rest.split()
    assert (code, seen, enabled) == ("0", "[False]", "True")
    assert int(frozen) > 20_000  # the modules, classes and plan the preparation made


@pytest.mark.parametrize("stages", [[{"id": "a", "run": "echo {{ nope }}"}], "not a list"])
def test_collection_is_back_on_when_the_run_never_starts(tmp_path: Path, stages: object,
                                                         ) -> None:
    code, seen, rest = _run(tmp_path, {"name": "p", "stages": stages})
    enabled, frozen = rest.split()
    assert (code, seen, enabled, frozen) == ("2", "[]", "True", "0")
