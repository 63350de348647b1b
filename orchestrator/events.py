"""The events of a run, the bus that delivers them, and the events.jsonl writer.

The runner publishes typed events (one frozen dataclass per event, below); consumers implement
the `EventHandler` methods they need (one per event, named by its `method`, as pyinfra's
BaseStateCallback) and the bus calls those a handler has. Every event serializes to the flat
dict written as one line of events.jsonl: `event`, `run_id`, `ts`, then its fields (None fields
left out). Everything is redacted before it is delivered.

Log lines are not events: structlog output reaches the run's `RunLog` (see orchestrator/logs.py),
which writes them into the same events.jsonl and hands them to LogHandlers; they never travel
through the bus. The run summary (summary.json) is another subscriber: orchestrator/summary.py.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from orchestrator.redact import REDACTOR, Redactor

#: One line of events.jsonl (an event or a log line), as a dict.
Record = dict[str, Any]


def utc_now() -> str:
    """ISO-8601 UTC timestamp with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_run_id() -> str:
    """A sortable, unique run id: 20261129T193000Z-1a2b3c."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{os.urandom(3).hex()}"


# -- the events -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event: `name` is its `event` value in events.jsonl, `method` its handler.

    `run_id` and `ts` are stamped by the bus when it publishes the event.
    """

    name: ClassVar[str] = ""
    method: ClassVar[str] = ""
    run_id: str = ""
    ts: str = ""

    def __init_subclass__(cls, *, name: str, method: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name, cls.method = name, method

    def payload(self) -> dict[str, Any]:
        """The event's own fields (without run_id and ts), None ones left out."""
        values = ((name, getattr(self, name)) for name in _payload_names(type(self)))
        return {name: value for name, value in values if value is not None}

    def to_record(self) -> Record:
        """The dict written as one line of events.jsonl."""
        return {"event": self.name, "run_id": self.run_id, "ts": self.ts, **self.payload()}

    def redacted(self, redactor: Redactor, **stamp: Any) -> Event:
        """A copy with every secret value masked (and the fields STAMP given)."""
        return replace(self, **{k: redactor.redact(v) for k, v in self.payload().items()},
                       **stamp)


@functools.cache
def _payload_names(cls: type[Event]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name not in ("run_id", "ts"))


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event, name="run.start", method="on_run_started"):
    """The run begins: its hosts, stage ids, node count and options."""

    hosts: list[str]
    stages: list[str]
    nodes: int
    dry_run: bool
    forks: int


@dataclass(frozen=True, kw_only=True)
class RunInterrupted(Event, name="run.interrupted", method="on_run_interrupted"):
    """Ctrl-C: remote commands are being stopped."""


@dataclass(frozen=True, kw_only=True)
class RunFinished(Event, name="run.end", method="on_run_finished"):
    """The run ended with this exit code."""

    exit_code: int
    duration_s: float


@dataclass(frozen=True, kw_only=True)
class HostStarted(Event, name="host.start", method="on_host_started"):
    """A host's walk begins; `stages` are its stage ids."""

    host: str
    stages: list[str]


@dataclass(frozen=True, kw_only=True)
class HostWaiting(Event, name="host.waiting", method="on_host_waiting"):
    """The host's SSH is not up yet; waiting (attempt n)."""

    host: str
    attempt: int
    elapsed_s: float
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class HostConnected(Event, name="host.connected", method="on_host_connected"):
    """The first connection to the host is open."""

    host: str
    duration_s: float


@dataclass(frozen=True, kw_only=True)
class HostLockTakenOver(Event, name="host.lock_takeover", method="on_host_lock_taken_over"):
    """The deploy lock left by a run that is gone was taken over; `previous` names its holder."""

    host: str
    path: str | None = None
    previous: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class HostLockRetaken(Event, name="host.lock_retaken", method="on_host_lock_retaken"):
    """A re-opened connection took this run's deploy lock again."""

    host: str
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class HostLockHeld(Event, name="host.lock_held", method="on_host_lock_held"):
    """Another deploy holds the host: nothing runs there."""

    host: str
    error: str


@dataclass(frozen=True, kw_only=True)
class HostRebooted(Event, name="host.rebooted", method="on_host_rebooted"):
    """The host rebooted during the run: its stages are walked again (pass `next_pass`)."""

    host: str
    next_pass: int


@dataclass(frozen=True, kw_only=True)
class HostUnreachable(Event, name="host.unreachable", method="on_host_unreachable"):
    """The host could not be reached (or was lost)."""

    host: str
    error: str


@dataclass(frozen=True, kw_only=True)
class HostFinished(Event, name="host.end", method="on_host_finished"):
    """A host's walk ended: ok, failed, unreachable or locked."""

    host: str
    status: str
    duration_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class StageStarted(Event, name="stage.start", method="on_stage_started"):
    """A (host, stage) node starts (its kind named)."""

    host: str
    stage: str
    kind: str


@dataclass(frozen=True, kw_only=True)
class StageProgress(Event, name="stage.progress", method="on_stage_progress"):
    """A running stage reports progress."""

    host: str
    stage: str
    message: str


@dataclass(frozen=True, kw_only=True)
class ReplicaRoll(Event, name="roll.step", method="on_replica_roll"):
    """A step of one replica behind the gateway whose server a deploy restarts
    (orchestrator.run.fleet): removed, drained, redeployed, added, serving, failed."""

    host: str
    step: str
    detail: str | None = None
    duration_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class StageCheckRetry(Event, name="stage.check_retry", method="on_stage_check_retry"):
    """A stage's check was cut by a dropped connection and is asked again."""

    host: str
    stage: str
    attempt: int
    error: str


@dataclass(frozen=True, kw_only=True)
class StageApply(Event, name="stage.apply", method="on_stage_apply"):
    """A stage's check found a change needed; applying it."""

    host: str
    stage: str
    attempt: int
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class CommandRan(Event, name="command", method="on_command"):
    """A command a stage ran on the host, with its output tails."""

    host: str
    stage: str
    attempt: int
    command: str
    exit_code: int
    duration_s: float
    timed_out: bool | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None


@dataclass(frozen=True, kw_only=True)
class StageRetry(Event, name="stage.retry", method="on_stage_retry"):
    """A stage attempt failed; retrying after `sleep_s`."""

    host: str
    stage: str
    attempt: int
    sleep_s: float
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class StageFinished(Event, name="stage.end", method="on_stage_finished"):
    """A (host, stage) node ended: its status, duration, reason, attempts, error and facts."""

    host: str
    stage: str
    status: str
    duration_s: float
    reason: str | None = None
    attempts: int | None = None
    error: str | None = None
    facts: dict[str, Any] | None = None
    check_s: float | None = None


class EventHandler:
    """The callback interface of a run: an `on_*` method per event, named by the event's
    `method` (e.g. `on_stage_finished(self, e: StageFinished)`); the bus calls the ones a
    handler defines and skips the rest. `EventBus.subscribe` registers it.
    """


# -- delivery ---------------------------------------------------------------------------------

RecordSink = Callable[[Record], None]


@runtime_checkable
class LogHandler(Protocol):
    """A consumer that also wants the run's log lines (as their events.jsonl records)."""

    def on_log(self, record: Record) -> None:
        """One log line: `event` is the log message, `level` its level."""


class EventBus:
    """Deliver events to handlers by type, and their records to sinks; thread-safe.

    A failing handler or sink never breaks the run.
    """

    def __init__(self, run_id: str, redactor: Redactor = REDACTOR) -> None:
        self.run_id = run_id
        self.redactor = redactor
        self._handlers: list[EventHandler] = []
        self._sinks: list[RecordSink] = []
        self._lock = threading.Lock()

    def subscribe(self, handler: EventHandler) -> None:
        """Add a handler (called in the publishing thread, under the bus lock)."""
        self._handlers.append(handler)

    def add_sink(self, sink: RecordSink) -> None:
        """Add a sink that receives every event as its events.jsonl record (e.g. JsonlWriter)."""
        self._sinks.append(sink)

    def publish(self, event: Event) -> Event:
        """Stamp, redact and deliver one event; returns it as delivered."""
        event = event.redacted(self.redactor, run_id=self.run_id, ts=utc_now())
        record = event.to_record()
        with self._lock:
            for sink in self._sinks:
                _safely(sink, record)
            for handler in self._handlers:
                on_event = getattr(handler, event.method, None)
                if on_event is not None:
                    _safely(on_event, event)
        return event


def _safely(call: Callable[[Any], None], arg: Any) -> None:
    try:
        call(arg)
    except Exception:  # noqa: BLE001 - a broken view must not stop a deploy
        pass


class RunLog:
    """Where a run's log lines go (apart from the bus): the events.jsonl writer and LogHandlers.

    Called by the structlog pipeline (orchestrator/logs.py) with the log's event dict.
    """

    def __init__(self, run_id: str, sinks: list[RecordSink] | None = None,
                 handlers: list[LogHandler] | None = None,
                 redactor: Redactor = REDACTOR) -> None:
        self.run_id = run_id
        self.sinks = list(sinks or [])
        self.handlers = list(handlers or [])
        self.redactor = redactor

    def __call__(self, event_dict: dict[str, Any]) -> None:
        record: Record = {"event": str(event_dict.get("event", "log")), "run_id": self.run_id,
                          "ts": utc_now()}
        record.update({k: v for k, v in event_dict.items()
                       if v is not None and k not in ("event", "timestamp", "run_id")})
        record = self.redactor.redact(record)
        for sink in self.sinks:
            _safely(sink, record)
        for handler in self.handlers:
            _safely(handler.on_log, record)


class JsonlWriter:
    """Record sink writing each record as one JSON line, flushed at once (a crash loses nothing).

    Events (from the bus) and log lines (from RunLog) share the file; writes are serialized.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def __call__(self, record: Record) -> None:
        line = json.dumps(record, default=str, ensure_ascii=False) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._fh.close()
