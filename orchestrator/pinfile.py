"""The pin file (runs/<run-id>/deploy.lock.json): what a deploy actually ran, to reproduce it
elsewhere exactly. Not to be confused with the host's deploy lock (remote/actions.py
lock_acquire/lock_release), which keeps two deploys off one host.

Stage kinds record what they pinned down under the fact key "lock" (a JSON object): e.g.
hf_download the repo and resolved commit, pip_install the versions resolved on the host,
sglang_server the SGLang version and the launch arguments. After each deploy the CLI writes
`runs/<run-id>/deploy.lock.json`:

    {"lock_version": 1, "playbook": ..., "run_id": ..., "created_at": ...,
     "stages": {stage_id: {...}},          # what every host agreed on
     "hosts": {host: {stage_id: {...}}}}   # per host, as recorded

`orchestrator deploy --locked FILE` gives each stage its entry of "stages" (ctx.locked); a kind
that finds the host would get something else refuses (PreflightError), and under `plan` reports
the drift as the reason a change is needed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, ConfigProblem, Location
from orchestrator.events import utc_now
from orchestrator.status import Status
from orchestrator.summary import RunSummary

LOCK_VERSION = 1


def build_pin(summary: RunSummary) -> dict[str, Any]:
    """A lock document from a run's summary."""
    hosts: dict[str, dict[str, Any]] = {}
    for host, h in summary.hosts.items():
        for sid, facts in h.facts.items():
            st = h.stages.get(sid)
            if st is None or st.status not in (Status.OK, Status.CHANGED):
                continue  # a failed stage's facts are not what the host runs
            if isinstance(facts.get("lock"), dict):
                hosts.setdefault(host, {})[sid] = facts["lock"]
    stages: dict[str, Any] = {}
    for per_host in hosts.values():
        for sid, entry in per_host.items():
            stages.setdefault(sid, [])
            if entry not in stages[sid]:
                stages[sid].append(entry)
    agreed = {sid: entries[0] for sid, entries in stages.items() if len(entries) == 1}
    return {
        "lock_version": LOCK_VERSION,
        "playbook": summary.playbook,
        "inventory": summary.inventory,
        "run_id": summary.run_id,
        "created_at": utc_now(),
        # a lock from a failed deploy only holds the stages that ended ok or changed
        "complete": summary.exit_code == 0,
        "stages": agreed,
        "disagreements": sorted(sid for sid, e in stages.items() if len(e) > 1),
        "hosts": hosts,
    }


def write_pin(lock: dict[str, Any], path: Path) -> None:
    """Write atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def load_pin(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a lock file; ConfigError (exit 2) when it is missing or not a lock."""
    where = Location(str(path), 1, 1)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(where, "lock file not found")]) from None
    except (OSError, ValueError) as exc:
        raise ConfigError([ConfigProblem(where, f"not a readable JSON lock file: {exc}")]) \
            from None
    if not isinstance(data, dict) or data.get("lock_version") != LOCK_VERSION \
            or not isinstance(data.get("stages"), dict):
        raise ConfigError([ConfigProblem(
            where, f"not a deploy lock file (lock_version {LOCK_VERSION} with `stages`)",
            "use the deploy.lock.json that a deploy wrote into its run directory")])
    return data


def drift_lines(summary: RunSummary, lock_path: str) -> list[str]:
    """The drift section `plan --locked` prints after its table.

    A stage whose reason starts with "drift:" differs from the lock; those marked "(deploy
    --locked refuses this)" would be refused, the others a locked deploy brings back to the lock.
    """
    drifts = [f"  {host} {sid}: {st.reason[len('drift:'):].strip()}"
              for host, h in summary.hosts.items() for sid, st in h.stages.items()
              if st.status == Status.WOULD_CHANGE and (st.reason or "").startswith("drift:")]
    if not drifts:
        return [f"no drift against {lock_path}"]
    return [f"drift against {lock_path} ({len(drifts)}):", *drifts]
