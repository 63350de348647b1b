"""`orchestrator pin PLAYBOOK -i INV`: the commits a deploy resolved, as a vars file.

    orchestrator pin PLAYBOOK -i INV [-o FILE] [--from RUN_DIR_OR_PINFILE] [--run-dir runs]

Reads the pin file of the newest complete deploy of PLAYBOOK under --run-dir (or the one --from
names: a run directory or its deploy.lock.json) and writes, for every hf_download stage whose
`revision:` is a plain variable reference (`"{{ target.revision }}"`), that variable with the
commit in place of the branch. `deploy --vars-file FILE` then installs exactly those commits
(and no longer warns that revisions are unpinned): staging's revisions go to production.

A vars file's top-level name REPLACES the variable's whole value (orchestrator.config.variables:
mappings are not merged, Ansible's default), so the file holds each named variable whole, as
the inventory's hosts have it (templates kept), with only the revision changed.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, ConfigProblem
from orchestrator.redact import is_secret_name

#: a `revision:` that names one variable (or a key path inside one)
_REFERENCE = re.compile(r"^\{\{\s*([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\}\}$")


def add_subcommands(sub: Any) -> None:
    """Register `pin`."""
    p = sub.add_parser(
        "pin", help="write the commits a deploy resolved into a vars file (--vars-file)",
        description=__doc__.split("\n\n", 2)[2].split("\n\nA vars")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("playbook", help="the playbook that was deployed")
    p.add_argument("-i", "--inventory", required=True, help="inventory YAML file")
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    p.add_argument("--from", dest="source", metavar="PATH",
                   help="a run directory or its deploy.lock.json (default: the newest "
                   "complete deploy of PLAYBOOK under --run-dir)")
    p.add_argument("--run-dir", default=os.environ.get("ORCHESTRATOR_RUN_DIR", "runs"),
                   help="where deploys keep their records (default: runs, or "
                   "$ORCHESTRATOR_RUN_DIR)")
    p.set_defaults(func=cmd_pin)


def cmd_pin(args: argparse.Namespace) -> int:
    import yaml

    import orchestrator.stages  # noqa: F401 - hands the stage kinds to config
    from orchestrator.config import load_all
    from orchestrator.pinfile import load_pin

    playbook, inventory = load_all(args.playbook, args.inventory)
    source = Path(args.source) if args.source else _newest(Path(args.run_dir), playbook.name)
    pin = load_pin(source / "deploy.lock.json" if source.is_dir() else source)
    out: dict[str, Any] = {}
    notes: list[str] = []
    for spec in playbook.stages:
        entry = pin.stages.get(spec.id)
        if spec.uses != "hf_download" or not isinstance(entry, dict):
            continue
        ref = _REFERENCE.match(str(spec.with_.get("revision", "")).strip())
        if ref is None:
            notes.append(f"{spec.id}: `revision: {spec.with_.get('revision')}` is not a plain "
                         f"variable reference: pin it by hand to {entry.get('commit')}")
            continue
        name, *path = ref.group(1).split(".")
        if name in playbook.secrets or is_secret_name(name):
            raise ConfigError([ConfigProblem(None, f"{spec.id}: `revision` comes from the secret "
                                             f"variable {name!r}: not written to a vars file")])
        value = out.get(name, _raw_value(playbook, inventory, name))
        out[name] = _with_leaf(value, path, entry.get("commit"), name)
        notes.append(f"{spec.id}: {entry.get('repo')} -> {entry.get('commit')}")
    _greedy_reference(playbook, source, out, notes)
    if not out:
        raise ConfigError([ConfigProblem(None, f"{source}: no hf_download commit to pin for "
                                         f"{playbook.name}", "; ".join(notes) or None)])
    head = (f"# written by `orchestrator pin` from run {pin.run_id} of {pin.playbook}\n"
            + "".join(f"#   {n}\n" for n in notes)
            + f"# use: orchestrator deploy {args.playbook} -i INVENTORY --vars-file THIS_FILE\n")
    text = head + yaml.safe_dump(out, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text)
        print(f"pinned {len(notes)} revision(s) into {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _greedy_reference(playbook: Any, source: Path, out: dict[str, Any],
                      notes: list[str]) -> None:
    """The greedy answers a deploy WITHOUT speculation recorded at ready (wait_ready's fact
    `greedy`), into the variable its `greedy_reference:` names: a later speculative deploy
    must answer the same."""
    import json

    summary = (source if source.is_dir() else source.parent) / "summary.json"
    try:
        hosts = json.loads(summary.read_text()).get("hosts") or {}
    except (OSError, ValueError):
        return
    for spec in playbook.stages:
        ref = _REFERENCE.match(str(spec.with_.get("greedy_reference", "")).strip())
        if spec.uses != "wait_ready" or ref is None or "." in ref.group(1):
            continue
        for host in hosts.values():
            greedy = (host.get("facts") or {}).get(spec.id, {}).get("greedy")
            if isinstance(greedy, dict) and not greedy.get("speculative") and greedy.get(
                    "answers"):
                out[ref.group(1)] = dict(greedy["answers"])
                notes.append(f"{spec.id}: {len(greedy['answers'])} greedy answers of the "
                             "target without speculation (a speculative deploy must match)")
                return


def _newest(run_dir: Path, playbook: str) -> Path:
    """The pin file of the newest complete deploy of PLAYBOOK under RUN_DIR."""
    import json

    found = []
    for path in run_dir.glob("*/deploy.lock.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("playbook") == playbook and data.get("complete"):
            found.append((str(data.get("created_at") or ""), path))
    if not found:
        raise ConfigError([ConfigProblem(
            None, f"no complete deploy of {playbook!r} under {run_dir}/",
            "deploy it first (staging), or name its record with --from RUN_DIR")])
    return max(found)[1]


def _raw_value(playbook: Any, inventory: Any, name: str) -> Any:
    """The variable as every host of the inventory has it before rendering (one value)."""
    from orchestrator.config.variables import raw_variable

    values = [raw_variable(playbook, inventory, host, name) for host in inventory.hosts]
    if any(v != values[0] for v in values):
        raise ConfigError([ConfigProblem(
            None, f"variable {name!r} differs between the inventory's hosts",
            "pin its revision by hand in each host's vars")])
    return copy.deepcopy(values[0])


def _with_leaf(value: Any, path: list[str], commit: Any, name: str) -> Any:
    """VALUE with the key PATH set to COMMIT (PATH empty: COMMIT itself)."""
    if not path:
        return commit
    if not isinstance(value, dict):
        raise ConfigError([ConfigProblem(None, f"variable {name!r} is not a mapping with "
                                         f"{'.'.join(path)}")])
    return {**value, path[0]: _with_leaf(value.get(path[0]), path[1:], commit, name)}
