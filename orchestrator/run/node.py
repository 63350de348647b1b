"""One stage on one host: the node execution of a run.

For each (host, stage) node it:
  1. skips it when `when:` is false (the node's skip reason),
  2. runs `check` (the spec's `check:` command, then the kind's own check): converged -> ok;
     under --dry-run a needed change is reported as would-change and nothing is applied,
  3. otherwise `apply` then `verify` -> changed, re-running the whole node per `retry:`
     (a kind whose apply takes the host out of service, `Stage.disruptive`, first passes the
     run's gate when a schedule set one: orchestrator.run.fleet)
     (tenacity). A check cut by a dropped connection is asked again (the host reconnects on
     demand) without spending an attempt; checks whose kind allows it are asked ahead of their
     turn (orchestrator.run.early).

It knows stages only through their interface (orchestrator.stages.base) and hosts only through
`orchestrator.host.Host`; it renders nothing (every node was rendered before the run).
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from orchestrator.config.model import RetrySpec
from orchestrator.errors import (
    CommandFailed,
    ConnectionLost,
    OrchestratorError,
    StageError,
    TransientConnectError,
)
from orchestrator.events import (
    CommandRan,
    EventBus,
    StageApply,
    StageCheckRetry,
    StageProgress,
    StageRetry,
    StageStarted,
)
from orchestrator.host import Host
from orchestrator.plan import Node
from orchestrator.result import Result
from orchestrator.run.early import EarlyCheck, HeldLog, Speculation
from orchestrator.run.state import RunState
from orchestrator.stages.base import CheckResult, Converged, StageContext, inventory_groups
from orchestrator.status import Status
from orchestrator.transports.agent_client import AgentTransport

log = structlog.get_logger("orchestrator.run")

T = TypeVar("T")
#: a stage's check is asked again this many times after a dropped connection
CHECK_RECONNECTS = 2


def _retry_policy(spec: RetrySpec | None, sleep: Callable[[float], None], bus: EventBus,
                  host: str, sid: str) -> Retrying:
    if spec is None:
        return Retrying(stop=stop_after_attempt(1), reraise=True, sleep=sleep)
    codes = {c for c in spec.on if isinstance(c, int)}
    on_connection = "connection" in spec.on

    def retryable(exc: BaseException) -> bool:
        if isinstance(exc, TransientConnectError):
            return on_connection
        if isinstance(exc, CommandFailed):
            return exc.result.exit_code in codes
        return False

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        bus.publish(StageRetry(
            host=host, stage=sid, attempt=state.attempt_number,
            sleep_s=round(state.upcoming_sleep, 2), error=str(exc).splitlines()[0] if exc else None,
        ))

    return Retrying(
        stop=stop_after_attempt(spec.attempts),
        wait=wait_exponential(multiplier=spec.delay, exp_base=spec.backoff, max=spec.max_delay),
        retry=retry_if_exception(retryable),
        reraise=True,
        before_sleep=before_sleep,
        sleep=sleep,
    )


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-n:])


class NodeRunner:
    """Runs the nodes of one host (its walk calls `run` from several threads at once) over the
    host's one connection (`connection()`: connected, holding the deploy lock)."""

    def __init__(self, state: RunState, host: str,
                 connection: Callable[[], AgentTransport]) -> None:
        self.state = state
        self.host = host
        self.connection = connection
        self._early: Speculation | None = None
        self._epoch = 0  # raised before every apply: the early answers asked before are stale
        self._lock = threading.Lock()

    def run(self, node: Node, unreachable: list[BaseException]) -> Status:
        """Run one node; its status. A host lost for good goes into UNREACHABLE."""
        host, sid, st = self.host, node.spec.id, self.state
        structlog.contextvars.bind_contextvars(host=host, stage=sid, run_id=st.bus.run_id)
        t0 = time.monotonic()
        if node.skip_reason or (host, sid) not in st.stages:
            return st.end_stage(host, sid, Status.SKIPPED, reason=node.skip_reason)
        st.bus.publish(StageStarted(host=host, stage=sid, kind=node.spec.kind))
        attempts = 0
        facts: dict[str, Any] = {}
        timings: dict[str, float] = {}
        try:
            transport = self.connection()
            for attempt in _retry_policy(node.spec.retry, st.options.sleep, st.bus, host, sid):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    structlog.contextvars.bind_contextvars(attempt=attempts)
                    status, reason = self._attempt(node, transport, attempts, facts, timings)
            return st.end_stage(host, sid, status, time.monotonic() - t0, reason=reason,
                                attempts=attempts, facts=facts or None,
                                check_s=timings.get("check_s"))
        except Exception as exc:  # noqa: BLE001 - a stage bug must not take the run down
            return self._failed(node, exc, time.monotonic() - t0, attempts,
                                facts, timings.get("check_s"), unreachable)

    def _failed(self, node: Node, exc: Exception, duration: float, attempts: int,
                facts: dict[str, Any], check_s: float | None,
                unreachable: list[BaseException]) -> Status:
        host, sid, st = self.host, node.spec.id, self.state
        if st.cancelled.is_set():
            return st.end_stage(host, sid, Status.INTERRUPTED, duration)
        if isinstance(exc, TransientConnectError):
            if not isinstance(exc, ConnectionLost):
                unreachable.append(exc)
            return st.end_stage(host, sid, Status.FAILED, duration, error=exc.render(),
                                attempts=attempts, check_s=check_s)
        if isinstance(exc, OrchestratorError):
            return st.end_stage(host, sid, Status.FAILED, duration, error=exc.render(),
                                attempts=attempts, facts=facts or None, check_s=check_s)
        log.error("stage.crashed", traceback=traceback.format_exc())
        return st.end_stage(
            host, sid, Status.FAILED, duration, attempts=attempts,
            error=f"internal error in stage kind {node.spec.kind!r}: {exc!r} "
                  "(please report it, with the traceback in events.jsonl)",
        )

    def _attempt(self, node: Node, transport: AgentTransport, attempt: int,
                 facts: dict[str, Any], timings: dict[str, float]) -> tuple[Status, str]:
        host, sid, bus = self.host, node.spec.id, self.state.bus

        def observe(result: Result) -> None:
            bus.publish(CommandRan(
                host=host, stage=sid, attempt=attempt, command=result.command,
                exit_code=result.exit_code, duration_s=round(result.duration, 3),
                timed_out=result.timed_out or None,
                stdout_tail=_tail(result.stdout) or None, stderr_tail=_tail(result.stderr) or None,
            ))

        def progress(message: str) -> None:
            if message:
                bus.publish(StageProgress(host=host, stage=sid, message=message[:300]))

        h, ctx, opened = self._env(node, transport, observe, progress, facts,
                                   structlog.get_logger(f"stage.{node.spec.kind}"))
        try:
            early = self._early.take(sid) if attempt == 1 and self._early is not None else None
            if early is not None:  # asked ahead of its turn, nothing changed since
                early.tell(observe, ctx)
            return self._check_apply(node, h, ctx, attempt, timings,
                                     known=(early.verdict, early.check_s) if early else None)
        finally:
            for t in opened:
                t.close()

    def _env(self, node: Node, transport: AgentTransport, observe: Callable[[Result], None],
             progress: Callable[[str], None], facts: dict[str, Any],
             log: Any) -> tuple[Host, StageContext, list[AgentTransport]]:
        """The Host and StageContext a stage's check and apply get; the connections they open
        to other hosts go into the list, for the caller to close."""
        st, spec = self.state, node.spec
        inventory = st.plan.inventory
        me = inventory.hosts[self.host]
        h = Host(me, transport, dict(me.vars), observer=observe, cancelled=st.cancelled)
        opened: list[AgentTransport] = []

        def open_host(name: str) -> Host:
            other = inventory.hosts.get(name)
            if other is None:
                raise StageError(f"host {name!r} is not in the inventory "
                                 f"{inventory.source or ''}".rstrip())
            t = st.factory(other, on_wait=None)
            opened.append(t)
            t.connect(budget=other.connect_budget)
            return Host(other, t, dict(other.vars), observer=observe, cancelled=st.cancelled)

        ctx = StageContext(
            spec=spec, run_id=st.bus.run_id, log=log,
            dry_run=st.options.dry_run, verify=st.options.verify, timeout=spec.timeout,
            facts=facts, progress=progress,
            secrets=st.redactor.values, env=node.env, open_host=open_host,
            inventory_hosts=dict(inventory.hosts), cancelled=st.cancelled,
            inventory_groups=inventory_groups(inventory),
            # the stage's entry of the pin, typed by its kind (NoPin: none; kinds that pin refuse)
            pin=st.options.pin.entry(spec.id, st.stages[(self.host, spec.id)].Pin)
            if st.options.pin is not None else None,
        )
        return h, ctx, opened

    def _read_only(self, sid: str, check: Callable[[], T]) -> T:
        """Run a check, asking again after a dropped connection (the host reconnects on demand).

        A check only reads (it is what --dry-run runs), so repeating it is always safe, like the
        transport's re-sent probes and file reads; it costs no attempt of the stage's `retry:`
        policy, which is for the changes that apply makes. Without this, the converged checks
        of a deploy over a flaky link spent the retry budget that an interrupted apply needs.
        """
        for n in range(1, CHECK_RECONNECTS + 2):
            try:
                return check()
            except ConnectionLost as exc:
                if n > CHECK_RECONNECTS or self.state.cancelled.is_set():
                    raise
                self.state.bus.publish(StageCheckRetry(host=self.host, stage=sid, attempt=n,
                                                       error=str(exc).splitlines()[0]))
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_apply(self, node: Node, h: Host, ctx: StageContext, attempt: int,
                     timings: dict[str, float],
                     known: tuple[CheckResult, float] | None = None) -> tuple[Status, str]:
        spec, sid = node.spec, node.spec.id
        stage = self.state.stages[(self.host, sid)]
        t = time.monotonic()
        if known is not None:  # its early answer (still valid: nothing changed since)
            verdict, timings["check_s"] = known
        else:
            if node.check_cmd is not None:
                r = self._read_only(sid, lambda: h.run(
                    node.check_cmd, timeout=spec.timeout, become=spec.become, env=node.env))
                if r.ok:
                    timings["check_s"] = round(time.monotonic() - t, 3)
                    return Status.OK, "check passed"
            verdict = self._read_only(sid, lambda: stage.check(h, ctx))
            timings["check_s"] = round(time.monotonic() - t, 3)
        if isinstance(verdict, Converged):
            return Status.OK, verdict.reason
        if self.state.options.dry_run:
            return Status.WOULD_CHANGE, verdict.reason
        if stage.disruptive and self.state.gate is not None:
            self.state.gate.leave(self.host)  # out of rotation and drained first
        with self._lock:  # the early answers asked until now no longer hold on this host
            self._epoch += 1
        self.state.bus.publish(StageApply(host=self.host, stage=sid, attempt=attempt,
                                          reason=verdict.reason))
        if verdict.plan is not None:  # what check() found and decided (Needed.plan)
            stage.apply(h, ctx, verdict.plan)
        else:
            stage.apply(h, ctx)
        stage.verify(h, ctx)
        return Status.CHANGED, verdict.reason

    # -- checks asked ahead of their turn (orchestrator.run.early) ----------------------------

    def speculate(self, stages: dict[str, Node]) -> None:
        """Ask now the checks of the host's stages whose kind allows it, over its connection."""
        kinds = [node for sid, node in stages.items()
                 if not node.skip_reason and node.check_cmd is None
                 and getattr(self.state.stages.get((self.host, sid)), "speculative_check", False)]
        if len(kinds) < 2:
            return
        try:
            transport = self.connection()
        except OrchestratorError:
            return
        self._early = Speculation(lambda: self._epoch, {
            node.spec.id: functools.partial(self._early_check, node, transport) for node in kinds})

    def drop_early(self) -> None:
        """Drop the early answers not taken (end of a pass over the host)."""
        early, self._early = self._early, None
        if early is not None:
            early.close()

    def _early_check(self, node: Node, transport: AgentTransport, held: EarlyCheck) -> Any:
        stage = self.state.stages[(self.host, node.spec.id)]
        structlog.contextvars.bind_contextvars(host=self.host, stage=node.spec.id,
                                               run_id=self.state.bus.run_id, attempt=1)
        h, ctx, opened = self._env(node, transport, held.commands.append,
                                   held.progress.append, held.facts, HeldLog(held))
        ctx.ahead = True
        try:
            return stage.check(h, ctx)
        finally:
            for t in opened:
                t.close()
