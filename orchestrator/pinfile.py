"""The pin: what a deploy actually ran, to reproduce it elsewhere exactly, kept in the pin file
runs/<run-id>/deploy.lock.json and enforced by `deploy --locked PINFILE` (the flag and the file
keep their names). Not to be confused with the host's deploy lock (remote/actions.py
lock_acquire/lock_release), which keeps two deploys off one host.

A stage kind that pins declares `Pin`, a frozen `StagePin` (e.g. hf_download: the repo and the
resolved commit; pip_install: the versions resolved on the host; sglang_server: the SGLang
version and the launch arguments), and records it as the fact "pin". After each deploy the pin
file is written:

    {"lock_version": 1, "playbook": ..., "run_id": ..., "created_at": ...,
     "stages": {stage_id: {...}},          # what every host agreed on
     "hosts": {host: {stage_id: {...}}}}   # per host, as recorded

Under `--locked` the runner hands each stage its entry of "stages" as its kind's `Pin`
(`StageContext.pin`; `NoPin` when the file has none); a kind that finds the host would get
something else refuses (PreflightError), and under `plan` reports the drift as the reason a
change is needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.errors import ConfigError, ConfigProblem, Location
from orchestrator.events import utc_now
from orchestrator.status import Status
from orchestrator.summary import RunSummary

#: the pin file's format (its key keeps the file's old name: "lock_version")
PIN_VERSION = 1

P = TypeVar("P", bound="StagePin")


@dataclass(frozen=True)
class StagePin:
    """What one stage pinned down: a JSON object, one key per field (lists read as tuples)."""

    def to_json(self) -> dict[str, Any]:
        """The entry as the pin file holds it."""
        return {f.name: _to_json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls: type[P], data: dict[str, Any]) -> P:
        """An entry of the pin file; a missing key reads as None (the stage then sees the
        difference)."""
        return cls(**{f.name: _from_json(data.get(f.name)) for f in fields(cls)})


@dataclass(frozen=True)
class NoPin(StagePin):
    """Under `--locked`, the pin file holds no entry for this stage (it was not run in the
    pinned deploy, or its hosts disagreed): a kind that pins refuses it."""


def _to_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _from_json(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class PinFile:
    """The pin file: the entries every host agreed on (raw JSON, typed per kind by `entry`)."""

    stages: dict[str, dict[str, Any]]
    hosts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)
    #: a pin from a failed deploy only holds the stages that ended ok or changed
    complete: bool = True
    playbook: str | None = None
    inventory: str | None = None
    run_id: str | None = None
    created_at: str | None = None

    def entry(self, stage_id: str, kind: type[StagePin] | None) -> StagePin | None:
        """The stage's entry as its kind's pin (NoPin when there is none; None for a kind
        that pins nothing)."""
        if kind is None:
            return None
        data = self.stages.get(stage_id)
        return kind.from_json(data) if isinstance(data, dict) else NoPin()

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {"lock_version": PIN_VERSION, **asdict(self)}


def build_pin(summary: RunSummary) -> PinFile:
    """The pin of a run, from its summary."""
    hosts: dict[str, dict[str, Any]] = {}
    for host, h in summary.hosts.items():
        for sid, facts in h.facts.items():
            st = h.stages.get(sid)
            if st is None or st.status not in (Status.OK, Status.CHANGED):
                continue  # a failed stage's facts are not what the host runs
            if isinstance(facts.get("pin"), dict):
                hosts.setdefault(host, {})[sid] = facts["pin"]
    stages: dict[str, Any] = {}
    for per_host in hosts.values():
        for sid, entry in per_host.items():
            stages.setdefault(sid, [])
            if entry not in stages[sid]:
                stages[sid].append(entry)
    return PinFile(
        stages={sid: entries[0] for sid, entries in stages.items() if len(entries) == 1},
        hosts=hosts,
        disagreements=sorted(sid for sid, e in stages.items() if len(e) > 1),
        complete=summary.exit_code == 0, playbook=summary.playbook,
        inventory=summary.inventory, run_id=summary.run_id, created_at=utc_now())


def write_pin(data: dict[str, Any], path: Path) -> None:
    """Write a pin file's JSON (PinFile.to_json, redacted) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def load_pin(path: str | os.PathLike[str]) -> PinFile:
    """Read a pin file; ConfigError (exit 2) when it is missing or not a pin file."""
    where = Location(str(path), 1, 1)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(where, "pin file not found")]) from None
    except (OSError, ValueError) as exc:
        raise ConfigError([ConfigProblem(where, f"not a readable JSON pin file: {exc}")]) \
            from None
    if not isinstance(data, dict) or data.get("lock_version") != PIN_VERSION \
            or not isinstance(data.get("stages"), dict):
        raise ConfigError([ConfigProblem(
            where, f"not a pin file (lock_version {PIN_VERSION} with `stages`)",
            "use the deploy.lock.json that a deploy wrote into its run directory")])
    return PinFile(**{f.name: data[f.name] for f in fields(PinFile) if f.name in data})


def drift_lines(summary: RunSummary, pin_path: str) -> list[str]:
    """The drift section `plan --locked` prints after its table.

    A stage whose reason starts with "drift:" differs from the pin; those marked "(deploy
    --locked refuses this)" would be refused, the others a pinned deploy brings back to the pin.
    """
    drifts = [f"  {host} {sid}: {st.reason[len('drift:'):].strip()}"
              for host, h in summary.hosts.items() for sid, st in h.stages.items()
              if st.status == Status.WOULD_CHANGE and (st.reason or "").startswith("drift:")]
    if not drifts:
        return [f"no drift against {pin_path}"]
    return [f"drift against {pin_path} ({len(drifts)}):", *drifts]
