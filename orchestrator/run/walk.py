"""One host's walk: its one connection, its deploy lock, its stages in dependency order, reboots.

The host's stages share one connection: the agent serves many requests at once over it, so
concurrent stages (up to --per-host; independent ones of its DAG, graphlib) cost no second SSH
connection. The connection holds the host's deploy lock (remote/actions.py lock_acquire) for
the run. When the host's boot id (remote/probes.py boot_id) changed while its stages ran, it
rebooted: its stages are walked again (converged ones are cheap), up to MAX_PASSES times.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from graphlib import TopologicalSorter
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.errors import LockHeld, OrchestratorError
from orchestrator.events import (
    HostConnected,
    HostFinished,
    HostLockHeld,
    HostLockRetaken,
    HostLockTakenOver,
    HostRebooted,
    HostStarted,
    HostUnreachable,
    HostWaiting,
    RunInterrupted,
    utc_now,
)
from orchestrator.facts.lock import BootId, DeployLock, LockHolder
from orchestrator.run.node import NodeRunner
from orchestrator.run.state import RunState
from orchestrator.status import Status
from orchestrator.transports.agent_client import AgentTransport

if TYPE_CHECKING:
    from orchestrator.preconnect import Preconnect

log = structlog.get_logger("orchestrator.run")

#: how many times a host's stages are walked when it reboots during the run
MAX_PASSES = 3


class _Connection:
    """A host's one connection, shared by every thread working on it, and the deploy lock it
    holds for the run.

    The lock lives with the agent that took it (it is released when that agent ends): a
    connection re-opened after a drop (the transport first ends the dropped agent) takes it
    again at once, so that another deploy cannot slip in while this one goes on.
    """

    def __init__(self, state: RunState, host: str, owner: dict[str, Any]) -> None:
        self.state = state
        self.host = host
        self.owner = owner
        self.spec = state.plan.inventory.hosts[host]
        self.transport: AgentTransport | None = None
        self._holder: tuple[Any, ...] | None = None  # the agent that holds the lock for us
        self._opening = threading.Lock()  # one connection is opened at a time

    def on_wait(self, attempt: int, elapsed: float, error: BaseException | str) -> None:
        """Tell a wait for a host that does not answer yet (console: "waiting for SSH...")."""
        self.state.bus.publish(HostWaiting(
            host=self.host, attempt=attempt, elapsed_s=round(elapsed, 1),
            error=str(error).splitlines()[0] if error else None,
        ))

    def adopt(self, t: AgentTransport) -> None:
        """Take over a transport connected elsewhere (orchestrator.preconnect)."""
        t.on_reconnect = functools.partial(self.lock, reopened=True)
        self.transport = t

    def open(self, budget: float) -> AgentTransport:
        """The connection, opened once; connected again if it was lost meanwhile."""
        with self._opening:
            t = self.transport
            if t is None:
                t = self.state.factory(self.spec, on_wait=self.on_wait)
                t.on_reconnect = functools.partial(self.lock, reopened=True)
                t.connect(budget=budget)
                self.transport = t
            elif not t.connected:
                t.connect(budget=budget)  # e.g. the container was restarted meanwhile
            return t

    def get(self) -> AgentTransport:
        """The connection a stage runs over: open, and holding the deploy lock."""
        t = self.open(self.spec.connect_budget)
        self.lock()
        return t

    def lock(self, reopened: bool = False) -> None:
        """Hold the host's deploy lock on this connection (no-op for a dry run); LockHeld when
        another deploy holds it."""
        st, t = self.state, self.transport
        if st.options.dry_run or t is None:
            return
        info = t.agent_info
        agent = (info.get("pid"), info.get("starttime"), info.get("boot_id"))
        if agent == self._holder:
            return  # this very agent took it for this run: it holds it until it ends
        answer = DeployLock.from_answer(
            t.act("lock_acquire", path=self.spec.lock_path, owner=self.owner))
        if answer.acquired:
            self._holder = agent
            prev = answer.previous
            if prev is not None and prev.run_id not in (None, st.bus.run_id):
                st.bus.publish(HostLockTakenOver(host=self.host, path=answer.path,
                                                 previous=prev.named()))
            elif reopened and not answer.held_here:
                st.bus.publish(HostLockRetaken(host=self.host, path=answer.path))
            return
        holder = answer.holder or LockHolder()
        if holder.run_id == st.bus.run_id:
            return  # held by another connection of this same run
        raise LockHeld(
            f"{self.host}: another deploy holds {answer.path}: run {holder.run_id} "
            f"of {holder.user}@{holder.operator} (playbook "
            f"{holder.playbook}), started {holder.started_at}",
            hint="wait for that deploy to finish or stop it; a lock left by a run that died "
                 "is released with its connection and taken over automatically",
        )

    def boot_id(self) -> str | None:
        """The host's boot id (None when it cannot be read): tells a reboot mid-run."""
        try:
            t = self.open(self.spec.connect_budget)
            return BootId.from_answer(t.probe(BootId.probe)).boot_id
        except OrchestratorError:
            return None

    def release(self) -> None:
        """Release the deploy lock (it would go with the agent anyway)."""
        t = self.transport
        if not self.state.options.dry_run and t is not None and t.connected:
            with contextlib.suppress(OrchestratorError):
                t.act("lock_release", path=self.spec.lock_path)

    def kill_all(self) -> None:
        """Stop every command running on the host (Ctrl-C; best effort)."""
        with contextlib.suppress(Exception):
            if self.transport is not None:
                self.transport.kill_all()

    def close(self) -> None:
        """Close the connection (the agent kills what still runs; best effort)."""
        t, self.transport = self.transport, None
        with contextlib.suppress(Exception):
            if t is not None:
                t.close()


class HostWalker:
    """Walks the hosts of a run: `walk(host)` once per host, from any thread (the schedules of
    orchestrator.run.parallel and orchestrator.run.fleet call it); `cancel` on Ctrl-C."""

    def __init__(self, state: RunState, preconnected: Preconnect | None = None) -> None:
        self.state = state
        self.preconnected = preconnected
        self._connections: dict[str, _Connection] = {}
        #: what the deploy lock's record says of this run
        self._owner = {
            "run_id": state.bus.run_id, "user": getpass.getuser(),
            "operator": socket.gethostname(), "pid": os.getpid(),
            "playbook": state.plan.playbook.name, "started_at": utc_now(),
        }

    def walk(self, host: str) -> None:
        """Connect to HOST, take its deploy lock, run its stages (again after a reboot), release
        the lock and close; every stage's end and the host's are told."""
        st = self.state
        structlog.contextvars.bind_contextvars(host=host, run_id=st.bus.run_id)
        t0 = time.monotonic()
        conn = self._connections[host] = _Connection(st, host, self._owner)
        st.bus.publish(HostStarted(host=host, stages=list(st.nodes[host])))
        if not self._first_connection(conn, t0):
            return
        unreachable: list[BaseException] = []
        nodes = NodeRunner(st, host, conn.get)
        boot = conn.boot_id()
        for pass_no in range(1, MAX_PASSES + 1):
            self._walk_dag(host, nodes, unreachable)
            if st.cancelled.is_set() or unreachable or st.options.dry_run:
                break
            now = conn.boot_id()
            if boot is None or now is None or now == boot:
                break
            # The host rebooted while we worked on it: what was converged before may not be
            # any more (CUDA, the server). Run its stages again; converged ones are cheap.
            boot = now
            if pass_no < MAX_PASSES:
                st.bus.publish(HostRebooted(host=host, next_pass=pass_no + 1))
        conn.release()
        conn.close()  # here, in the host's thread: 64 closes in a row at the end cost a second
        if unreachable:
            st.outcome.mark(host, Status.UNREACHABLE)
            st.bus.publish(HostUnreachable(host=host, error=str(unreachable[0])))
        overall = Status.FAILED if st.outcome.host_failed(host) else (
            Status.UNREACHABLE if unreachable else Status.OK)
        st.bus.publish(HostFinished(host=host, status=overall,
                                    duration_s=round(time.monotonic() - t0, 3)))

    def walk_all(self, hosts: list[str], then: Callable[[str], None] | None = None,
                 forks: int | None = None) -> None:
        """Walk HOSTS at once, up to `forks` (default --forks) at a time; `then(host)` runs in
        the host's thread after its walk. Ctrl-C (KeyboardInterrupt in the calling thread)
        cancels the run, waits up to 30 s for the walks to stop and is raised again."""
        forks = max(1, min(forks or self.state.options.forks, len(hosts)))
        pool = ThreadPoolExecutor(max_workers=forks, thread_name_prefix="host")

        def one(host: str) -> None:
            try:
                self.walk(host)
            finally:
                if then is not None:
                    then(host)

        futures = [pool.submit(one, h) for h in hosts]
        try:
            while wait(futures, timeout=0.2).not_done:
                pass
        except KeyboardInterrupt:
            self.cancel()
            wait(futures, timeout=30)
            raise
        finally:
            pool.shutdown(wait=not self.state.cancelled.is_set(), cancel_futures=True)
        for f in futures:
            if f.exception() is not None:  # a bug in the runner: keep the other hosts' results
                log.error("runner.host_crashed", error=repr(f.exception()))

    def cancel(self) -> None:
        """Stop every remote command this run started (Ctrl-C)."""
        st = self.state
        if st.cancelled.is_set():
            return
        st.cancelled.set()
        st.outcome.interrupted = True
        st.bus.publish(RunInterrupted())
        for conn in list(self._connections.values()):
            conn.kill_all()

    def close(self) -> None:
        """Close the connections still open (the end of the run)."""
        for conn in list(self._connections.values()):
            conn.close()

    def _first_connection(self, conn: _Connection, t0: float) -> bool:
        """The host's first connection (the one opened early for it, preconnect, else new)
        and its deploy lock; False when the host is unreachable or locked (then told)."""
        st, host = self.state, conn.host
        try:
            early = self.preconnected.claim(host, conn.spec, conn.on_wait) \
                if self.preconnected else None
            if early is not None:
                try:
                    conn.adopt(early.result())
                except OrchestratorError:
                    raise  # the attempt told its waits already: the host is unreachable
                except Exception:  # noqa: BLE001 - not ours to judge: connect here, as usual
                    log.debug("preconnect.failed", exc_info=True)
            conn.open(max(st.options.wait_for_host, conn.spec.wait_for_host or 0.0))
        except OrchestratorError as exc:
            self._refused(host, Status.UNREACHABLE, exc)
            return False
        st.bus.publish(HostConnected(host=host, duration_s=round(time.monotonic() - t0, 3)))
        try:
            conn.lock()
        except LockHeld as exc:
            self._refused(host, Status.LOCKED, exc)
            return False
        except OrchestratorError as exc:
            self._refused(host, Status.UNREACHABLE, exc)
            return False
        return True

    def _refused(self, host: str, status: Status, exc: OrchestratorError) -> None:
        """Nothing runs on HOST: unreachable, or locked by another deploy."""
        st = self.state
        st.outcome.mark(host, status)
        if status == Status.LOCKED:
            st.bus.publish(HostLockHeld(host=host, error=exc.render()))
            st.skip([host], "another deploy holds the host")
        else:
            st.bus.publish(HostUnreachable(host=host, error=exc.render()))
            st.skip([host], "host unreachable")
        st.bus.publish(HostFinished(host=host, status=status))

    def _walk_dag(self, host: str, nodes: NodeRunner, unreachable: list[BaseException]) -> None:
        """Run one host's stages in dependency order, independent ones concurrently."""
        st = self.state
        stages = st.nodes[host]
        sorter = TopologicalSorter(st.plan.graph(host))
        sorter.prepare()
        nodes.speculate(stages)
        blocked: dict[str, str] = {}
        running: dict[Future[Status], str] = {}
        try:
            with ThreadPoolExecutor(max_workers=max(1, st.options.per_host),
                                    thread_name_prefix=host) as ex:
                while sorter.is_active():
                    for sid in sorter.get_ready():
                        reason = self._blocked_reason(sid, blocked, unreachable)
                        if reason:
                            blocked[sid] = reason if reason.startswith("after ") else \
                                blocked.get(sid, reason)
                            st.end_stage(host, sid, Status.SKIPPED, reason=reason)
                            sorter.done(sid)
                            continue
                        running[ex.submit(nodes.run, stages[sid], unreachable)] = sid
                    if not running:
                        continue
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for fut in done:
                        sid = running.pop(fut)
                        status = fut.result()
                        if status.bad:
                            blocked[sid] = f"{sid} {status}"  # the root cause, passed down
                        sorter.done(sid)
        finally:
            nodes.drop_early()

    def _blocked_reason(self, sid: str, blocked: dict[str, str],
                        unreachable: list[BaseException]) -> str | None:
        if self.state.cancelled.is_set():
            return "interrupted before it started"
        if unreachable:
            return "host unreachable"
        for dep in self.state.plan.stages[sid].needs:
            if dep in blocked:
                root = blocked[dep]
                return root if root.startswith("after ") else f"after {root}"
        return None
