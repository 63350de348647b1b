"""The fault matrix, fast form: the `--fast` rows of scripts/faults.py on one simulated box.

The rows run once (module fixture: one box converged by a real deploy, then each row injects its
fault, runs the real CLI, checks the outcome and that nothing was left behind, and converges the
box again); each row is then its own test. `make faults` runs every row.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.scripts import load_script

faults = load_script("faults")
FAST = faults.select(None, fast=True)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    lines: list[str] = []
    results, info = faults.run_matrix(FAST, tmp_path_factory.mktemp("faults"), jobs=1,
                                      scale=0.001, log=lines.append)
    return {"results": {r.fault: r for r in results}, "info": info,
            "table": faults.table(results)}


def test_the_fast_subset_covers_the_kinds_of_fault() -> None:
    names = {row.name for row in FAST}
    # a host fault, a hanging command, a crashed server, a cut upload and a Ctrl-C
    assert {"gpu-missing", "command-hangs", "server-crash-ready", "ssh-cut-upload",
            "sigint-ready"} <= names
    assert len(FAST) < len(faults.ROWS)


@pytest.mark.parametrize("row", [row.name for row in FAST])
def test_fault_row(matrix: dict[str, Any], row: str) -> None:
    r = matrix["results"].get(row)
    assert r is not None, f"row {row} did not run:\n{matrix['table']}"
    assert r.passed, f"{faults.details([r])}\n\n{matrix['table']}"
    assert r.outcome and r.detect_s is not None and r.detect_s >= 0


def test_nothing_of_the_simulator_is_left(matrix: dict[str, Any]) -> None:
    assert matrix["info"]["left"] == []
