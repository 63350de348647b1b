"""What one run shares (the rendered plan and its stages, the bus, the options, Ctrl-C) and
what it did: per host, per stage Status, and the exit code that maps to."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.errors import Interrupted
from orchestrator.events import EventBus, RunFinished, RunStarted, StageFinished
from orchestrator.options import RunOptions
from orchestrator.plan import RenderedPlan
from orchestrator.redact import REDACTOR, Redactor
from orchestrator.stages.base import Stage, stage_kinds
from orchestrator.status import Status
from orchestrator.transports import make_transport
from orchestrator.transports.agent_client import AgentTransport

EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 3  # 2 (bad input) is raised before a run
EXIT_INTERRUPTED = Interrupted.exit_code  # 130

TransportFactory = Callable[..., AgentTransport]


class Gate(Protocol):
    """What a schedule puts on RunState.gate for the node runner: asked before a stage whose
    apply takes its host out of service (`Stage.disruptive`) applies (orchestrator.run.fleet)."""

    def leave(self, host: str) -> None:
        """Return once HOST may go out of service (it is out of rotation and drained); raise
        an OrchestratorError when it may not."""


@dataclass
class Outcome:
    """What a run did: per host, per stage status; and the exit code it maps to."""

    statuses: dict[str, dict[str, Status]] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)
    locked: set[str] = field(default_factory=set)
    interrupted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        """130 interrupted > 3 a host unreachable > 1 a stage failed > 0."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.unreachable:
            return EXIT_UNREACHABLE
        if self.locked or any(
            s == Status.FAILED for st in self.statuses.values() for s in st.values()
        ):
            return EXIT_FAILED
        return EXIT_OK

    def set(self, host: str, sid: str, status: Status) -> None:
        """Record SID's status on HOST (a stage's id, or "roll")."""
        with self._lock:
            self.statuses.setdefault(host, {})[sid] = status

    def mark(self, host: str, status: Status) -> None:
        """The host as a whole: Status.UNREACHABLE or Status.LOCKED."""
        with self._lock:
            (self.locked if status == Status.LOCKED else self.unreachable).add(host)

    def host_ok(self, host: str) -> bool:
        """Reached, not locked, and no stage failed or was interrupted."""
        return host not in self.unreachable and host not in self.locked and \
            not self.host_failed(host)

    def host_failed(self, host: str) -> bool:
        """A stage of HOST failed or was interrupted."""
        return any(s.bad for s in self.statuses.get(host, {}).values())


class RunState:
    """What every part of one run shares: the rendered plan and one Stage per node to run (kinds
    keep no state on self), the bus, the options, the outcome and the Ctrl-C event."""

    def __init__(self, rendered: RenderedPlan, bus: EventBus, *,
                 options: RunOptions | None = None,
                 transport_factory: TransportFactory = make_transport,
                 redactor: Redactor = REDACTOR) -> None:
        self.plan = rendered.plan
        self.nodes = rendered.nodes
        self.bus = bus
        self.options = options or RunOptions()
        self.factory = transport_factory
        self.redactor = redactor
        self.outcome = Outcome()
        self.cancelled = threading.Event()
        #: set by a schedule that gates disruptive applies (orchestrator.run.fleet); None: none
        self.gate: Gate | None = None
        for secrets in rendered.secrets.values():
            redactor.add(*secrets)
        kinds = stage_kinds()
        self.stages: dict[tuple[str, str], Stage] = {
            (host, sid): kinds[node.kind](node.params)
            for host, mine in rendered.nodes.items() for sid, node in mine.items()
            if node.params is not None
        }

    def end_stage(self, host: str, sid: str, status: Status, duration: float = 0.0, *,
                  reason: str | None = None, attempts: int | None = None,
                  error: str | None = None, facts: dict[str, Any] | None = None,
                  check_s: float | None = None) -> Status:
        """Record how a node ended and tell it (StageFinished)."""
        if status == Status.OK and self.outcome.statuses.get(host, {}).get(sid) == \
                Status.CHANGED:
            # walked again after a reboot: it was changed in this run, and still holds
            status = Status.CHANGED
            reason = f"changed earlier in this run; {reason or 'ok'}"
        self.outcome.set(host, sid, status)
        self.bus.publish(StageFinished(
            host=host, stage=sid, status=status, duration_s=round(duration, 3), reason=reason,
            attempts=attempts, error=error, facts=facts, check_s=check_s,
        ))
        return status

    def skip(self, hosts: Iterable[str], reason: str | None) -> None:
        """Every stage of HOSTS ends skipped, for REASON."""
        for host in hosts:
            for sid in self.nodes.get(host, {}):
                self.end_stage(host, sid, Status.SKIPPED, reason=reason)

    def started(self) -> float:
        """Tell the run's start; the monotonic time it started."""
        opts = self.options
        self.bus.publish(RunStarted(
            hosts=list(self.plan.hosts), stages=list(self.plan.stages),
            nodes=self.plan.node_count, dry_run=opts.dry_run, forks=opts.forks,
        ))
        return time.monotonic()

    def finished(self, t0: float) -> Outcome:
        """Tell the run's end (its exit code); the outcome."""
        self.bus.publish(RunFinished(exit_code=self.outcome.exit_code,
                                     duration_s=round(time.monotonic() - t0, 3)))
        return self.outcome
