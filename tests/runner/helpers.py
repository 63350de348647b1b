"""Helpers for running the real `orchestrator` CLI in a subprocess and reading its run record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass
class CliRun:
    """A finished CLI run: exit code, output and the run record it wrote."""

    code: int
    stdout: str
    stderr: str
    run_dir: Path | None

    @property
    def summary(self) -> dict[str, Any]:
        assert self.run_dir is not None, self.stderr
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def events(self) -> list[dict[str, Any]]:
        assert self.run_dir is not None
        lines = (self.run_dir / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def statuses(self, host: str) -> dict[str, str]:
        return {k: v["status"] for k, v in self.summary["hosts"][host]["stages"].items()}


def cli(*args: str, runs: Path, env: dict[str, str] | None = None, timeout: float = 120,
        cwd: Path | None = None) -> CliRun:
    """Run `python -m orchestrator ARGS` with its run records under `runs`."""
    # HOME per test: `connection: local` hosts keep their deploy lock under ~/.orchestrator,
    # and tests run in parallel
    full_env = {**os.environ, "ORCHESTRATOR_RUN_DIR": str(runs),
                "HOME": str(runs.parent / "home"), **(env or {})}
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd,
    )
    latest = runs / "latest"
    run_dir = latest.resolve() if latest.exists() else None
    if run_dir is not None:
        latest.unlink()  # so the next call cannot read a stale record
    return CliRun(p.returncode, p.stdout, p.stderr, run_dir)


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def local_inventory(path: Path, names: tuple[str, ...] = ("localhost",)) -> Path:
    """Local hosts whose deploy lock lives beside the inventory (tests run in parallel)."""
    return write_yaml(path, {"hosts": {
        n: {"connection": "local", "lock_path": str(path.parent / f"{n}.deploy.lock")}
        for n in names}})
