"""Walk a plan: hosts in a bounded pool, each host's independent stages concurrently, with retries.

It runs a RenderedPlan (orchestrator.plan.render_plan): every (host, stage) node was rendered for
its host before the run (a template error is exit 2 with nothing touched). For each node it:
  1. skips it when `when:` is false or a stage it needs failed,
  2. runs `check` (the spec's `check:` command, then the kind's own check): converged -> "ok";
     under --dry-run a needed change is reported as "would-change" and nothing is applied,
  3. otherwise `apply` then `verify` -> "changed", re-running the whole node per `retry:`.

It knows stages only through their interface (orchestrator.stages.base) and hosts only through
`orchestrator.host.Host`. It publishes events on the bus; views and records subscribe.
A host's concurrently running stages share its one agent connection (the agent multiplexes
requests); a transport that cannot multiplex gets one connection per running stage, opened lazily.
"""

from __future__ import annotations

import functools
import getpass
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from orchestrator.config.model import HostSpec, RetrySpec
from orchestrator.errors import (
    CommandFailed,
    ConnectionLost,
    Interrupted,
    LockHeld,
    OrchestratorError,
    StageError,
    TransientConnectError,
)
from orchestrator.events import (
    CommandRan,
    EventBus,
    HostConnected,
    HostFinished,
    HostLockHeld,
    HostLockRetaken,
    HostLockTakenOver,
    HostRebooted,
    HostStarted,
    HostUnreachable,
    HostWaiting,
    RunFinished,
    RunInterrupted,
    RunStarted,
    StageApply,
    StageCheckRetry,
    StageFinished,
    StageProgress,
    StageRetry,
    StageStarted,
    utc_now,
)
from orchestrator.host import Host
from orchestrator.options import RunOptions
from orchestrator.plan import Node, RenderedPlan
from orchestrator.redact import REDACTOR, Redactor
from orchestrator.result import Result
from orchestrator.speculate import EarlyCheck, HeldLog, Speculation
from orchestrator.stages.base import (
    CheckResult,
    Converged,
    Stage,
    StageContext,
    inventory_groups,
    stage_kinds,
)
from orchestrator.transports import make_transport
from orchestrator.transports.base import Transport

if TYPE_CHECKING:
    from orchestrator.preconnect import Preconnect

log = structlog.get_logger("orchestrator.runner")

#: how many times a host's stages are walked when it reboots during the run
MAX_PASSES = 3

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_INTERRUPTED = Interrupted.exit_code  # 130

TransportFactory = Callable[..., Transport]
T = TypeVar("T")
#: a stage's check is asked again this many times after a dropped connection
CHECK_RECONNECTS = 2


@dataclass
class Outcome:
    """What a run did: per host, per stage status; and the exit code it maps to."""

    statuses: dict[str, dict[str, str]] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)
    locked: set[str] = field(default_factory=set)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        """130 interrupted > 3 a host unreachable > 1 a stage failed > 0."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.unreachable:
            return EXIT_UNREACHABLE
        if self.locked or any(
            s == "failed" for st in self.statuses.values() for s in st.values()
        ):
            return EXIT_FAILED
        return EXIT_OK


def _lock_holder(transport: Transport) -> tuple[int, Any, Any, Any] | None:
    """Who holds a deploy lock taken through TRANSPORT: its agent process (pid, start time and
    boot id, from the agent's hello), which keeps the lock until it releases it or ends
    (remote/actions.py lock_acquire); None when the transport names no agent. A connection
    re-opened after a drop has a new agent, and so takes the lock again."""
    info = getattr(transport, "agent_info", None) or {}
    if not info.get("pid"):
        return None
    return (id(transport), info.get("pid"), info.get("starttime"), info.get("boot_id"))


class _ConnectionPool:
    """The connections to one host.

    A transport that multiplexes (`multiplexed = True`: the agent serves many requests at once
    over one SSH channel) is opened once and shared by every thread working on the host, so
    concurrent stages cost no second SSH connection. Any other transport is used by one thread
    at a time, and the pool opens one per concurrently running stage.
    """

    def __init__(self, spec: HostSpec, factory: TransportFactory, on_wait: Callable[..., None],
                 on_reconnect: Callable[[Transport], None] | None = None):
        self.spec = spec
        self.factory = factory
        self.on_wait = on_wait
        self.on_reconnect = on_reconnect
        self._free: list[Transport] = []
        self._all: list[Transport] = []
        self._shared: Transport | None = None
        self._lock = threading.Lock()
        self._opening = threading.Lock()  # one connection is opened at a time

    def acquire(self, budget: float) -> Transport:
        with self._opening:
            with self._lock:
                t = self._shared or (self._free.pop() if self._free else None)
            if t is not None:
                if not getattr(t, "connected", True):
                    t.connect(budget=budget)  # e.g. the container was restarted meanwhile
                return t
            t = self.factory(self.spec, on_wait=self.on_wait)
            if self.on_reconnect is not None:
                t.on_reconnect = functools.partial(self.on_reconnect, t)
            t.connect(budget=budget)
            with self._lock:
                self._all.append(t)
                if getattr(t, "multiplexed", False):
                    self._shared = t
            return t

    def adopt(self, t: Transport) -> None:
        """Take over a transport connected elsewhere (orchestrator.preconnect)."""
        if self.on_reconnect is not None:
            t.on_reconnect = functools.partial(self.on_reconnect, t)
        with self._lock:
            self._all.append(t)
            if getattr(t, "multiplexed", False):
                self._shared = t
            else:
                self._free.append(t)

    def connections(self) -> list[Transport]:
        with self._lock:
            return [t for t in self._all if getattr(t, "connected", True)]

    def release(self, t: Transport) -> None:
        with self._lock:
            if t is not self._shared:
                self._free.append(t)

    def kill_all(self) -> None:
        with self._lock:
            transports = list(self._all)
        for t in transports:
            try:
                t.kill_all()
            except Exception:  # noqa: BLE001 - best effort on Ctrl-C
                pass

    def close(self) -> None:
        with self._lock:
            transports, self._all, self._free = list(self._all), [], []
            self._shared = None
        for t in transports:
            try:
                t.close()
            except Exception:  # noqa: BLE001
                pass


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


class Runner:
    """Runs a prepared plan over its hosts and publishes what happens."""

    def __init__(
        self,
        rendered: RenderedPlan,
        bus: EventBus,
        *,
        options: RunOptions | None = None,
        transport_factory: TransportFactory = make_transport,
        redactor: Redactor = REDACTOR,
        preconnected: Preconnect | None = None,
    ) -> None:
        plan = rendered.plan
        self.plan = plan
        self.nodes = rendered.nodes
        self.bus = bus
        self.options = options or RunOptions()
        self.factory = transport_factory
        self.redactor = redactor
        self.outcome = Outcome()
        self.preconnected = preconnected
        self._speculations: dict[str, Speculation] = {}
        self._epochs: dict[str, int] = {}
        self._cancel = threading.Event()
        self._pools: dict[str, _ConnectionPool] = {}
        #: agents known to hold their host's deploy lock for this run (`_lock_holder`)
        self._lock_holders: set[tuple[int, Any, Any, Any]] = set()
        self._lock = threading.Lock()
        for secrets in rendered.secrets.values():
            redactor.add(*secrets)
        kinds = stage_kinds()
        #: one Stage per node to run (kinds keep no state on self)
        self._stages: dict[tuple[str, str], Stage] = {
            (host, sid): kinds[node.kind](node.params)
            for host, mine in rendered.nodes.items() for sid, node in mine.items()
            if node.params is not None
        }
        self._owner = {
            "run_id": bus.run_id, "user": getpass.getuser(), "operator": socket.gethostname(),
            "pid": os.getpid(), "playbook": plan.playbook.name, "started_at": utc_now(),
        }

    # -- public -------------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Run every host; returns the outcome. Ctrl-C in the calling thread cancels cleanly."""
        opts = self.options
        self.bus.publish(RunStarted(
            hosts=list(self.plan.hosts), stages=list(self.plan.stages),
            nodes=self.plan.node_count, dry_run=opts.dry_run, forks=opts.forks,
        ))
        t0 = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=max(1, opts.forks), thread_name_prefix="host")
        futures = [pool.submit(self._run_host, h) for h in self.plan.hosts]
        try:
            while True:
                done, pending = wait(futures, timeout=0.2)
                if not pending:
                    break
        except KeyboardInterrupt:
            self.cancel()
            wait(futures, timeout=30)
        finally:
            pool.shutdown(wait=not self._cancel.is_set(), cancel_futures=True)
            for p in list(self._pools.values()):
                p.close()
        for f in futures:
            exc = f.exception() if f.done() else None
            if exc is not None:  # a bug in the runner itself: keep the other hosts' results
                log.error("runner.host_crashed", error=repr(exc))
        self.bus.publish(RunFinished(
            exit_code=self.outcome.exit_code, duration_s=round(time.monotonic() - t0, 3),
        ))
        return self.outcome

    def cancel(self) -> None:
        """Stop every remote command this run started (Ctrl-C)."""
        if self._cancel.is_set():
            return
        self._cancel.set()
        self.outcome.interrupted = True
        self.bus.publish(RunInterrupted())
        for p in list(self._pools.values()):
            p.kill_all()

    # -- per host -----------------------------------------------------------------------------

    def _set_status(self, host: str, sid: str, status: str) -> None:
        with self._lock:
            self.outcome.statuses.setdefault(host, {})[sid] = status

    def _run_host(self, host: str) -> None:
        structlog.contextvars.bind_contextvars(host=host, run_id=self.bus.run_id)
        spec = self.plan.inventory.hosts[host]
        t0 = time.monotonic()
        stages = self.nodes[host]

        def on_wait(attempt: int, elapsed: float, error: BaseException | str) -> None:
            self.bus.publish(HostWaiting(
                host=host, attempt=attempt, elapsed_s=round(elapsed, 1),
                error=str(error).splitlines()[0] if error else None,
            ))

        def relock(t: Transport) -> None:  # the lock lives with the connection that took it
            self._take_lock(host, spec, t, reopened=True)

        pool = _ConnectionPool(spec, self.factory, on_wait, relock)
        self._pools[host] = pool
        self.bus.publish(HostStarted(host=host, stages=list(stages)))
        wait_for_host = max(self.options.wait_for_host, spec.wait_for_host or 0.0)
        try:
            first = self._first_connection(host, pool, wait_for_host, on_wait)
        except OrchestratorError as exc:
            self._host_unreachable(host, stages, exc)
            return
        self.bus.publish(HostConnected(host=host, duration_s=round(time.monotonic() - t0, 3)))
        try:
            self._take_lock(host, spec, first)
        except LockHeld as exc:
            self._host_locked(host, stages, exc)
            return
        except OrchestratorError as exc:
            self._host_unreachable(host, stages, exc)
            return
        finally:
            pool.release(first)

        unreachable: list[BaseException] = []
        boot = self._boot_id(pool)
        for pass_no in range(1, MAX_PASSES + 1):
            self._walk(host, stages, pool, unreachable)
            if self._cancel.is_set() or unreachable or self.options.dry_run:
                break
            now = self._boot_id(pool)
            if boot is None or now is None or now == boot:
                break
            # The host rebooted while we worked on it: what was converged before may not be
            # any more (CUDA, the server). Run its stages again; converged ones are cheap.
            boot = now
            if pass_no < MAX_PASSES:
                self.bus.publish(HostRebooted(host=host, next_pass=pass_no + 1))
        self._release_lock(spec, pool)
        pool.close()  # here, in the host's thread: 64 closes in a row at the end cost a second
        if unreachable:
            with self._lock:
                self.outcome.unreachable.add(host)
            self.bus.publish(HostUnreachable(host=host, error=str(unreachable[0])))
        statuses = self.outcome.statuses.get(host, {})
        overall = "failed" if any(s in ("failed", "interrupted") for s in statuses.values()) \
            else ("unreachable" if unreachable else "ok")
        self.bus.publish(HostFinished(host=host, status=overall,
                                      duration_s=round(time.monotonic() - t0, 3)))

    def _first_connection(self, host: str, pool: _ConnectionPool, budget: float,
                          on_wait: Callable[..., None]) -> Transport:
        """The host's first connection: the one opened early for it (preconnect), else new."""
        early = (self.preconnected.claim(host, pool.spec, on_wait) if self.preconnected
                 else None)
        if early is not None:
            try:
                pool.adopt(early.result())
            except OrchestratorError:
                raise  # the attempt told its waits already: the host is unreachable
            except Exception:  # noqa: BLE001 - not ours to judge: connect here, as usual
                log.debug("preconnect.failed", exc_info=True)
        return pool.acquire(budget)

    def _walk(self, host: str, stages: dict[str, Node], pool: _ConnectionPool,
              unreachable: list[BaseException]) -> None:
        """Run one host's stages in dependency order, independent ones concurrently."""
        sorter = TopologicalSorter(self.plan.graph(host))
        sorter.prepare()
        self._speculate(host, stages, pool)
        try:
            self._walk_sorted(host, stages, pool, unreachable, sorter)
        finally:
            spec = self._speculations.pop(host, None)
            if spec is not None:
                spec.close()

    def _walk_sorted(self, host: str, stages: dict[str, Node], pool: _ConnectionPool,
                     unreachable: list[BaseException], sorter: TopologicalSorter[str]) -> None:
        blocked: dict[str, str] = {}
        running: dict[Future[str], str] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.options.per_host),
                                thread_name_prefix=f"{host}") as ex:
            while sorter.is_active():
                for sid in sorter.get_ready():
                    reason = self._blocked_reason(host, sid, blocked, unreachable)
                    if reason:
                        blocked[sid] = reason if reason.startswith("after ") else blocked.get(
                            sid, reason)
                        self._end_stage(host, sid, "skipped", 0.0, reason=reason)
                        sorter.done(sid)
                        continue
                    fut = ex.submit(self._run_stage, host, stages[sid], pool, unreachable)
                    running[fut] = sid
                if not running:
                    continue
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    sid = running.pop(fut)
                    status = fut.result()
                    if status in ("failed", "interrupted"):
                        blocked[sid] = f"{sid} {status}"  # the root cause, passed down
                    sorter.done(sid)

    def _boot_id(self, pool: _ConnectionPool) -> str | None:
        """The host's boot id (None when it cannot be read): tells a reboot mid-run."""
        try:
            t = pool.acquire(pool.spec.connect_budget)
        except OrchestratorError:
            return None
        try:
            return t.probe("boot_id").get("boot_id")
        except OrchestratorError:
            return None
        finally:
            pool.release(t)

    def _release_lock(self, spec: HostSpec, pool: _ConnectionPool) -> None:
        if self.options.dry_run:
            return
        for t in pool.connections():
            try:
                t.act("lock_release", path=spec.lock_path)
            except OrchestratorError:
                pass

    def _blocked_reason(self, host: str, sid: str, blocked: dict[str, str],
                        unreachable: list[BaseException]) -> str | None:
        if self._cancel.is_set():
            return "interrupted before it started"
        if unreachable:
            return "host unreachable"
        spec = self.plan.stages[sid]
        for dep in spec.needs:
            if dep in blocked:
                root = blocked[dep]
                return root if root.startswith("after ") else f"after {root}"
        return None

    def _host_unreachable(self, host: str, stages: dict[str, Node],
                          exc: BaseException) -> None:
        with self._lock:
            self.outcome.unreachable.add(host)
        msg = exc.render() if isinstance(exc, OrchestratorError) else str(exc)
        self.bus.publish(HostUnreachable(host=host, error=msg))
        for sid in stages:
            self._end_stage(host, sid, "skipped", 0.0, reason="host unreachable")
        self.bus.publish(HostFinished(host=host, status="unreachable"))

    def _take_lock(self, host: str, spec: HostSpec, transport: Transport,
                   reopened: bool = False) -> None:
        """Hold the host's deploy lock on this connection (no-op for a dry run).

        Also called when a connection is re-opened on demand (after the transport ended the
        agent of the dropped one, which held the lock): another deploy must not slip in while
        this one goes on.
        """
        if self.options.dry_run:
            return
        holder = _lock_holder(transport)
        with self._lock:
            if holder is not None and holder in self._lock_holders:
                return  # this very agent took it for this run: it holds it until it ends
        res = transport.act("lock_acquire", path=spec.lock_path, owner=self._owner)
        if res.get("acquired") and holder is not None:
            with self._lock:
                self._lock_holders.add(holder)
        if res.get("acquired"):
            prev = res.get("previous") or {}
            if prev.get("run_id") not in (None, self.bus.run_id):
                self.bus.publish(HostLockTakenOver(host=host, path=res.get("path"),
                                                   previous=prev))
            elif reopened and not res.get("held_here"):
                self.bus.publish(HostLockRetaken(host=host, path=res.get("path")))
            return
        holder = res.get("holder") or {}
        if holder.get("run_id") == self.bus.run_id:
            return  # held by another connection of this same run
        raise LockHeld(
            f"{host}: another deploy holds {res.get('path')}: run {holder.get('run_id')} "
            f"of {holder.get('user')}@{holder.get('operator')} (playbook "
            f"{holder.get('playbook')}), started {holder.get('started_at')}",
            hint="wait for that deploy to finish or stop it; a lock left by a run that died "
                 "is released with its connection and taken over automatically",
        )

    def _host_locked(self, host: str, stages: dict[str, Node], exc: LockHeld) -> None:
        with self._lock:
            self.outcome.locked.add(host)
        self.bus.publish(HostLockHeld(host=host, error=exc.render()))
        for sid in stages:
            self._end_stage(host, sid, "skipped", 0.0, reason="another deploy holds the host")
        self.bus.publish(HostFinished(host=host, status="locked"))

    def _end_stage(self, host: str, sid: str, status: str, duration: float, *,
                   reason: str | None = None, attempts: int | None = None,
                   error: str | None = None, facts: dict[str, Any] | None = None,
                   check_s: float | None = None) -> str:
        earlier = self.outcome.statuses.get(host, {}).get(sid)
        if status == "ok" and earlier == "changed":
            # walked again after a reboot: it was changed in this run, and still holds
            status = "changed"
            reason = f"changed earlier in this run; {reason or 'ok'}"
        self._set_status(host, sid, status)
        self.bus.publish(StageFinished(
            host=host, stage=sid, status=status, duration_s=round(duration, 3), reason=reason,
            attempts=attempts, error=error, facts=facts, check_s=check_s,
        ))
        return status

    # -- per stage ----------------------------------------------------------------------------

    def _run_stage(self, host: str, node: Node, pool: _ConnectionPool,
                   unreachable: list[BaseException]) -> str:
        sid = node.spec.id
        structlog.contextvars.bind_contextvars(host=host, stage=sid, run_id=self.bus.run_id)
        t0 = time.monotonic()
        if node.skip_reason or (host, sid) not in self._stages:
            return self._end_stage(host, sid, "skipped", 0.0, reason=node.skip_reason)
        self.bus.publish(StageStarted(host=host, stage=sid, kind=node.spec.kind))
        spec = node.spec
        attempts = 0
        facts: dict[str, Any] = {}
        timings: dict[str, float] = {}
        transport: Transport | None = None
        try:
            transport = pool.acquire(pool.spec.connect_budget)
            self._take_lock(host, pool.spec, transport)
            for attempt in _retry_policy(spec.retry, self.options.sleep, self.bus, host, sid):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    structlog.contextvars.bind_contextvars(attempt=attempts)
                    status, reason = self._attempt(host, node, transport, attempts, facts, timings)
            return self._end_stage(host, sid, status, time.monotonic() - t0, reason=reason,
                                   attempts=attempts, facts=facts or None,
                                   check_s=timings.get("check_s"))
        except TransientConnectError as exc:
            if self._cancel.is_set():
                return self._end_stage(host, sid, "interrupted", time.monotonic() - t0)
            if not isinstance(exc, ConnectionLost):
                unreachable.append(exc)
            return self._end_stage(host, sid, "failed", time.monotonic() - t0,
                                   error=exc.render(), attempts=attempts,
                                   check_s=timings.get("check_s"))
        except OrchestratorError as exc:
            if self._cancel.is_set():
                return self._end_stage(host, sid, "interrupted", time.monotonic() - t0)
            return self._end_stage(host, sid, "failed", time.monotonic() - t0,
                                   error=exc.render(), attempts=attempts, facts=facts or None,
                                   check_s=timings.get("check_s"))
        except Exception as exc:  # noqa: BLE001 - a stage bug must not take the run down
            if self._cancel.is_set():
                return self._end_stage(host, sid, "interrupted", time.monotonic() - t0)
            log.error("stage.crashed", traceback=traceback.format_exc())
            return self._end_stage(
                host, sid, "failed", time.monotonic() - t0, attempts=attempts,
                error=f"internal error in stage kind {spec.kind!r}: {exc!r} "
                      "(please report it, with the traceback in events.jsonl)",
            )
        finally:
            if transport is not None:
                pool.release(transport)

    def _attempt(self, host: str, node: Node, transport: Transport, attempt: int,
                 facts: dict[str, Any], timings: dict[str, float]) -> tuple[str, str]:
        sid = node.spec.id

        def observe(result: Result) -> None:
            self.bus.publish(CommandRan(
                host=host, stage=sid, attempt=attempt, command=result.command,
                exit_code=result.exit_code, duration_s=round(result.duration, 3),
                timed_out=result.timed_out or None,
                stdout_tail=_tail(result.stdout) or None, stderr_tail=_tail(result.stderr) or None,
            ))

        def progress(message: str) -> None:
            if message:
                self.bus.publish(StageProgress(host=host, stage=sid, message=message[:300]))

        h, ctx, opened = self._stage_env(host, node, transport, observe, progress, facts,
                                         structlog.get_logger(f"stage.{node.spec.kind}"))
        try:
            early = self._early(host, sid) if attempt == 1 else None
            if early is not None:  # asked ahead of its turn, nothing changed since
                early.tell(observe, ctx)
            return self._check_apply(host, node, h, ctx, attempt, timings,
                                     known=(early.verdict, early.check_s) if early else None)
        finally:
            for t in opened:
                t.close()

    def _stage_env(self, host: str, node: Node, transport: Transport,
                   observe: Callable[[Result], None], progress: Callable[[str], None],
                   facts: dict[str, Any], log: Any) -> tuple[Host, StageContext, list[Transport]]:
        """The Host and StageContext a stage's check and apply get; the connections they open
        to other hosts go into the list, for the caller to close."""
        spec, sid = node.spec, node.spec.id
        variables = dict(self.plan.inventory.hosts[host].vars)
        h = Host(self.plan.inventory.hosts[host], transport, variables, observer=observe,
                 cancelled=self._cancel)
        opened: list[Transport] = []

        def open_host(name: str) -> Host:
            other = self.plan.inventory.hosts.get(name)
            if other is None:
                raise StageError(f"host {name!r} is not in the inventory "
                                 f"{self.plan.inventory.source or ''}".rstrip())
            t = self.factory(other, on_wait=None)
            opened.append(t)
            t.connect(budget=other.connect_budget)
            return Host(other, t, dict(other.vars), observer=observe, cancelled=self._cancel)

        ctx = StageContext(
            spec=spec, run_id=self.bus.run_id, log=log,
            dry_run=self.options.dry_run, verify=self.options.verify, timeout=spec.timeout,
            facts=facts, progress=progress,
            secrets=self.redactor.values, env=node.env, open_host=open_host,
            inventory_hosts=dict(self.plan.inventory.hosts), cancelled=self._cancel,
            inventory_groups=inventory_groups(self.plan.inventory),
            # the stage's entry of the pin, typed by its kind (NoPin: none; kinds that pin refuse)
            pin=self.options.pin.entry(sid, self._stages[(host, sid)].Pin)
            if self.options.pin is not None else None,
        )
        return h, ctx, opened

    # -- checks asked ahead of their turn (orchestrator.speculate) ----------------------------

    def _speculate(self, host: str, stages: dict[str, Node], pool: _ConnectionPool) -> None:
        """Ask now the checks of this host's stages whose kind allows it (see speculate)."""
        kinds = [(sid, node) for sid, node in stages.items()
                 if not node.skip_reason and node.check_cmd is None
                 and getattr(self._stages.get((host, sid)), "speculative_check", False)]
        if len(kinds) < 2:
            return
        try:
            transport = pool.acquire(pool.spec.connect_budget)
        except OrchestratorError:
            return
        if not getattr(transport, "multiplexed", False):
            pool.release(transport)
            return
        spec = self._speculations[host] = Speculation(lambda: self._epochs.get(host, 0))
        for sid, node in kinds:
            spec.start(sid, functools.partial(self._early_check, host, node, transport))

    def _early_check(self, host: str, node: Node, transport: Transport,
                     held: EarlyCheck) -> Any:
        stage = self._stages[(host, node.spec.id)]
        structlog.contextvars.bind_contextvars(host=host, stage=node.spec.id,
                                               run_id=self.bus.run_id, attempt=1)
        log = HeldLog(held)
        h, ctx, opened = self._stage_env(host, node, transport, held.commands.append,
                                         held.progress.append, held.facts, log)
        ctx.ahead = True
        try:
            return stage.check(h, ctx)
        finally:
            for t in opened:
                t.close()

    def _early(self, host: str, sid: str) -> EarlyCheck | None:
        spec = self._speculations.get(host)
        return spec.take(sid) if spec is not None else None

    def _changing(self, host: str) -> None:
        """Before an apply: the early answers asked until now no longer hold on this host."""
        with self._lock:
            self._epochs[host] = self._epochs.get(host, 0) + 1

    def _read_only(self, host: str, sid: str, check: Callable[[], T]) -> T:
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
                if n > CHECK_RECONNECTS or self._cancel.is_set():
                    raise
                self.bus.publish(StageCheckRetry(host=host, stage=sid, attempt=n,
                                                 error=str(exc).splitlines()[0]))
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_apply(self, host: str, node: Node, h: Host, ctx: StageContext,
                     attempt: int, timings: dict[str, float],
                     known: tuple[CheckResult, float] | None = None) -> tuple[str, str]:
        spec, sid = node.spec, node.spec.id
        stage = self._stages.get((host, sid))
        assert stage is not None
        t = time.monotonic()
        if known is not None:  # its early answer (still valid: nothing changed since)
            verdict, timings["check_s"] = known
        else:
            if node.check_cmd is not None:
                r = self._read_only(host, sid, lambda: h.run(
                    node.check_cmd, timeout=spec.timeout, become=spec.become, env=node.env))
                if r.ok:
                    timings["check_s"] = round(time.monotonic() - t, 3)
                    return "ok", "check passed"
            verdict = self._read_only(host, sid, lambda: stage.check(h, ctx))
            timings["check_s"] = round(time.monotonic() - t, 3)
        if isinstance(verdict, Converged):
            return "ok", verdict.reason
        if self.options.dry_run:
            return "would-change", verdict.reason
        self._changing(host)
        self.bus.publish(StageApply(host=host, stage=sid, attempt=attempt,
                                    reason=verdict.reason))
        if verdict.plan is not None:  # what check() found and decided (Needed.plan)
            stage.apply(h, ctx, verdict.plan)
        else:
            stage.apply(h, ctx)
        stage.verify(h, ctx)
        return "changed", verdict.reason
