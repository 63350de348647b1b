"""`orchestrator init DIR`: copy the shipped playbooks and configs out to start a project.

    orchestrator init DIR [--force]

DIR gets `playbooks/` (the K2.6 deploys, their baseline, fleet and two-node variants, and
`examples/`) and `configs/` (the model profile and example inventories), as the wheel ships
them (package `orchestrator.project`); the playbooks find their profile as in this repository
(`vars_files: ../configs/...`). Existing files are kept unless --force.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError

FOLDERS = ("playbooks", "configs")


def add_subcommands(sub: Any) -> None:
    """Register `init`."""
    p = sub.add_parser("init", help="copy the shipped playbooks and configs into a folder",
                       description=__doc__.split("\n\n", 2)[2],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="the folder to create (or fill)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(func=cmd_init)


def _copy(src: Traversable, dest: Path, force: bool, done: list[Path], kept: list[Path]) -> None:
    for item in sorted(src.iterdir(), key=lambda t: t.name):
        target = dest / item.name
        if item.is_dir():
            _copy(item, target, force, done, kept)
        elif item.name.endswith(".yaml"):
            if target.exists() and not force:
                kept.append(target)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(item.read_bytes())
            done.append(target)


def cmd_init(args: argparse.Namespace) -> int:
    root = resources.files("orchestrator.project")
    dest = Path(args.dir)
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest} exists and is not a folder")
    done: list[Path] = []
    kept: list[Path] = []
    for folder in FOLDERS:
        _copy(root / folder, dest / folder, args.force, done, kept)
    for path in kept:
        print(f"kept {path} (exists; --force overwrites)", file=sys.stderr)
    print(f"wrote {len(done)} files into {dest}/ (playbooks/, configs/)", file=sys.stderr)
    print(f"next: cd {dest} && orchestrator sim up --dir .sim --hosts 1 && orchestrator deploy "
          "playbooks/kimi-k2.6-eagle3.yaml -i .sim/inventory.yaml", file=sys.stderr)
    return 0
