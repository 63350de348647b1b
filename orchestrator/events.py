"""The event bus of a run and its file subscribers (events.jsonl, summary.json).

The runner publishes events; the JSON log, the console progress view and the run record are
subscribers. Every event is a flat dict with at least `event`, `run_id` and `ts`; per-(host, stage)
events also carry `host`, `stage` and `attempt`. Everything is redacted before it is written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator.redact import REDACTOR, Redactor

Event = dict[str, Any]
Subscriber = Callable[[Event], None]

#: Statuses of a (host, stage) node, in the order the summary sorts them.
STATUSES = ("ok", "changed", "would-change", "failed", "skipped", "unreachable", "interrupted")


def utc_now() -> str:
    """ISO-8601 UTC timestamp with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_run_id() -> str:
    """A sortable, unique run id: 20261129T193000Z-1a2b3c."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{os.urandom(3).hex()}"


class EventBus:
    """Fan events out to subscribers; thread-safe; a failing subscriber never breaks the run."""

    def __init__(self, run_id: str, redactor: Redactor = REDACTOR) -> None:
        self.run_id = run_id
        self.redactor = redactor
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, sub: Subscriber) -> None:
        """Add a subscriber (called in the publishing thread, under the bus lock)."""
        self._subs.append(sub)

    def publish(self, event: str, **fields: Any) -> Event:
        """Publish one event; returns the redacted event as delivered."""
        data: Event = {"event": event, "run_id": self.run_id, "ts": utc_now()}
        data.update({k: v for k, v in fields.items() if v is not None})
        data = self.redactor.redact(data)
        with self._lock:
            for sub in self._subs:
                try:
                    sub(data)
                except Exception:  # noqa: BLE001 - a broken view must not stop a deploy
                    pass
        return data


class JsonlWriter:
    """Subscriber writing each event as one JSON line, flushed at once (a crash loses nothing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def __call__(self, event: Event) -> None:
        self._fh.write(json.dumps(event, default=str, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


class RunRecord:
    """Subscriber that keeps host x stage status and durations; writes summary.json."""

    def __init__(self, run_id: str, playbook: str, inventory: str, dry_run: bool = False):
        self.run_id = run_id
        self.started = time.time()
        self.data: dict[str, Any] = {
            "run_id": run_id,
            "playbook": playbook,
            "inventory": inventory,
            "dry_run": dry_run,
            "started_at": utc_now(),
            "finished_at": None,
            "exit_code": None,
            "hosts": {},
        }

    def _host(self, name: str) -> dict[str, Any]:
        return self.data["hosts"].setdefault(
            name, {"status": "pending", "stages": {}, "facts": {}, "error": None}
        )

    def __call__(self, event: Event) -> None:
        kind = event["event"]
        host = event.get("host")
        if host is None:
            return
        h = self._host(host)
        if kind in ("host.unreachable", "host.lock_held"):
            h["status"] = "unreachable" if kind == "host.unreachable" else "locked"
            h["error"] = event.get("error")
        elif kind == "stage.end":
            st = h["stages"].setdefault(event["stage"], {})
            for key in ("status", "duration_s", "reason", "attempts", "error", "check_s"):
                if key in event:
                    st[key] = event[key]
            if event.get("facts"):
                h["facts"][event["stage"]] = event["facts"]
        elif kind == "host.end":
            h["status"] = event.get("status", "done")
            h["duration_s"] = event.get("duration_s")

    def finish(self, exit_code: int) -> None:
        """Stamp the end of the run."""
        self.data["finished_at"] = utc_now()
        self.data["duration_s"] = round(time.time() - self.started, 3)
        self.data["exit_code"] = exit_code

    def write(self, path: Path, redactor: Redactor = REDACTOR) -> None:
        """Write summary.json atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(redactor.redact(self.data), indent=2, default=str) + "\n")
        os.replace(tmp, path)
