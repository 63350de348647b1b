"""The fleet schedule: every deploy of a plan with a `gateway` stage (`--rolling` is an alias)
takes at most `--max-unavailable` replicas out of rotation.

All hosts are walked at once (as orchestrator.run.parallel does), with a gate on RunState
(`FleetGate`): the node runner calls `gate.leave(host)` before a stage whose apply takes its
host out of service (`Stage.disruptive`: sglang_server) on a replica behind the gateway (the
gateway stage's `urls`). An unchanged replica never meets the gate. At the gate:

  1. a replica already OUT of rotation (not listed Ready; when GET /workers does not answer,
     its own /health is not 200) goes on at once: it costs no capacity;
  2. barrier: a serving replica waits until every replica reached its gate or ended its walk,
     and the gateway's host ended its walk (prepare steps ran on all replicas in parallel, and
     the gateway stage's own reconcile is over); it does not leave when the gateway's host
     failed, nor after a replica of this roll failed (the roll stops);
  3. budget: it leaves only when (out now + 1) <= --max-unavailable, out now counting every
     desired worker not listed Ready and those this run took out; it waits while replicas of
     this run are on their way back, and is refused when none is;
  4. out: DELETE /workers/{id}; SMG marks a Ready worker Draining (no longer picked) and drops
     it after drain_settle_secs (smg 1.13.0 model_gateway/src/workflow/steps/local/
     drain_workers.rs:1-7, 64-85; crates/protocols/src/worker.rs:466-475, default 5 s); drain
     proof: the replica's OWN sglang:num_running_reqs + sglang:num_queue_reqs read 0 twice in a
     row (no answer is NOT drained); past `drain_timeout` it is put back and fails.

After the host's walk (`FleetGate.walked`, in its thread) a replica this run took out comes
back: unlisted, POST /workers, listed Ready within `ready_timeout`, then the back-in proof: a
chat through the gateway succeeded AND its own sglang:num_requests_total grew. A replica whose
walk failed stays out (and counts). Each step is a ReplicaRoll event with its duration. A deploy
SIGKILLed mid-roll is repaired by the next: the gateway stage re-adds a replica once its /health
answers, and one whose server must start again is out, so it goes on at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.errors import Interrupted, OrchestratorError, PlanError, StageError
from orchestrator.events import ReplicaRoll
from orchestrator.host import Host
from orchestrator.run.parallel import ParallelRun
from orchestrator.run.state import Outcome, RunState
from orchestrator.run.walk import HostWalker
from orchestrator.stages.base import StageContext, inventory_groups, stage_kinds
from orchestrator.status import Status

if TYPE_CHECKING:
    from orchestrator.preconnect import Preconnect
    from orchestrator.stages.gateway.api import GatewayApi as Api
    from orchestrator.stages.gateway.api import Member
    from orchestrator.transports.agent_client import AgentTransport

#: the stage kind whose workers are the fleet
GATEWAY_KIND = "gateway"
#: consecutive zero readings of a replica's running + queued requests that prove it drained
DRAINED_READINGS = 2
#: SMG's status of a worker being removed (crates/protocols/src/worker.rs:136-160)
DRAINING = "draining"
#: longest wait for the gateway to stop routing to (or to unlist) a removed worker; SMG drops a
#: Draining worker after drain_settle_secs (default 5 s, worker.rs:441-443)
UNLIST_TIMEOUT_S = 60.0
POLL_S = 0.2


# -- the rules (pure: tests/run/test_fleet_rules.py) ------------------------------------------

def serving(url: str, listed: Sequence[Member] | None, own_health_ok: Callable[[], bool]) -> bool:
    """In rotation: the gateway lists it Ready; when the gateway does not answer GET /workers,
    its own /health answers 200 (asked only then)."""
    if listed is None:
        return own_health_ok()
    return any(m.url == url and m.ready for m in listed)


def out_of_rotation(urls: dict[str, str], listed: Sequence[Member] | None,
                    own_health_ok: Callable[[str], bool]) -> set[str]:
    """The replicas (keys of URLS) not in rotation (serving, per URL)."""
    return {h for h, u in urls.items()
            if not serving(u, listed, lambda u=u: own_health_ok(u))}  # type: ignore[misc]


def may_leave(host: str, out: set[str], max_unavailable: int) -> bool:
    """A replica already out goes on; a serving one only while (out + 1) <= max_unavailable."""
    return host in out or len(out) + 1 <= max_unavailable


def barrier_open(wait_for: Iterable[str], arrived: set[str], done: set[str]) -> bool:
    """Every host waited for reached its gate or ended its walk."""
    return all(h in arrived or h in done for h in wait_for)


def drained(readings: Sequence[int | None]) -> bool:
    """The last DRAINED_READINGS readings are all 0 (None, no answer, is not 0)."""
    tail = readings[-DRAINED_READINGS:]
    return len(tail) == DRAINED_READINGS and all(r == 0 for r in tail)


def routed_away(url: str, listed: Sequence[Member] | None) -> bool:
    """The gateway no longer picks URL: not listed, or listed Draining (None: cannot tell)."""
    if listed is None:
        return False
    return all(m.url != url or m.status == DRAINING for m in listed)


def unlisted(url: str, listed: Sequence[Member] | None) -> bool:
    """The gateway lists no entry for URL (None: cannot tell)."""
    return listed is not None and all(m.url != url for m in listed)


def draining(url: str, listed: Sequence[Member] | None) -> bool:
    """The gateway lists URL Draining (a removal not finished yet)."""
    return listed is not None and any(m.url == url and m.status == DRAINING for m in listed)


def listed_ready(url: str, listed: Sequence[Member] | None) -> bool:
    """The gateway lists URL Ready."""
    return listed is not None and any(m.url == url and m.ready for m in listed)


def back_in(chat_ok: bool, before: int | None, now: int | None) -> bool:
    """A chat through the gateway succeeded AND the replica's own counter grew."""
    return chat_ok and before is not None and now is not None and now > before


class FleetGate:
    """RunState.gate of a fleet run: when a replica may leave the gateway, and its way back.
    `leave` is called by the node runner (any host thread), `walked` after each host's walk."""

    def __init__(self, state: RunState, gateway_host: str, stage: Any,
                 urls: dict[str, str]) -> None:
        self.state = state
        self.gateway_host = gateway_host
        self.stage = stage
        self.urls = urls
        self.max_unavailable = state.options.max_unavailable
        hosts = set(state.plan.hosts)
        self.wait_for = {h for h in [*urls, gateway_host] if h in hosts}
        self.arrived: set[str] = set()
        self.done: set[str] = set()
        self.taken: dict[str, float] = {}  # replicas this run took out -> when
        self.failed: set[str] = set()  # replicas of this roll that failed: the roll stops
        self.cond = threading.Condition()
        self._api: Api | None = None
        self._transport: AgentTransport | None = None
        self._opening = threading.Lock()

    def leave(self, host: str) -> None:
        """Return once HOST is out of rotation and drained (at once when it already is)."""
        if host not in self.urls:
            return  # not a replica behind the gateway
        with self.cond:
            self.arrived.add(host)
            self.cond.notify_all()
            if host in self.taken:
                return  # taken out earlier in this run (a retry, a walk after a reboot)
        api, url = self.api(), self.urls[host]
        if not serving(url, api.workers(), lambda: api.worker_health(url).ok):
            with self.cond:
                self.taken[host] = time.monotonic()
            self._step(host, "removed", f"{url} was not in rotation: it goes on at once")
            return
        with self.cond:
            while not barrier_open(self.wait_for, self.arrived, self.done):
                self._wait()
        self._gateway_ok(f"{host} keeps serving and is not restarted")
        self._reserve(api, host)
        try:
            self._take_out(api, host, url)
        except OrchestratorError as exc:  # it was put back (not out): the roll stops
            self._fail(host, exc.render().splitlines()[0], out=False)
            raise

    def walked(self, host: str) -> None:
        """After HOST's walk: a replica this run took out comes back (or stays out, failed)."""
        with self.cond:
            self.done.add(host)
            self.cond.notify_all()
            since = self.taken.get(host)
        if since is None or host in self.failed:
            return
        if not self.state.outcome.host_ok(host):
            self._fail(host, "its stages failed: it stays out of the gateway", since)
            return
        self._step(host, "redeployed", None, since)
        try:
            self._rejoin(self.api(), host, self.urls[host])
        except OrchestratorError as exc:
            self._fail(host, exc.render().splitlines()[0])

    def close(self) -> None:
        """Close the connection to the gateway's host."""
        t, self._transport = self._transport, None
        if t is not None:
            t.close()

    def api(self) -> Api:
        """The gateway's API over one connection to its host (opened once, shared)."""
        with self._opening:
            if self._api is None:
                st = self.state
                spec = st.plan.inventory.hosts[self.gateway_host]
                t = st.factory(spec, on_wait=None)
                t.connect(budget=spec.connect_budget)
                self._transport = t
                self._api = self.stage.api(Host(spec, t, dict(spec.vars),
                                                cancelled=st.cancelled))
            return self._api

    def _gateway_ok(self, then: str) -> None:
        """Raise when the gateway's host (walked in this run) did not converge."""
        g = self.gateway_host
        if g in self.wait_for and not self.state.outcome.host_ok(g):
            raise StageError(f"the gateway's host {g} did not converge: {then}")

    def _reserve(self, api: Api, host: str) -> None:
        """Wait for room under --max-unavailable; refuse when nothing will make room."""
        n = self.max_unavailable
        with self.cond:
            while True:
                if self.failed:
                    raise StageError(f"the roll stopped ({', '.join(sorted(self.failed))} "
                                     f"failed): {host} keeps serving and is not restarted")
                out = out_of_rotation(self.urls, api.workers(),
                                      lambda u: api.worker_health(u).ok) | set(self.taken)
                if may_leave(host, out, n):
                    self.taken[host] = time.monotonic()
                    return
                if not set(self.taken) - self.failed:  # nobody of this run is on its way back
                    raise StageError(
                        f"{len(out)} replica(s) out of rotation ({', '.join(sorted(out))}) and "
                        f"--max-unavailable {n}: {host} keeps serving and is not restarted",
                        hint="bring them back first (a deploy restarts them), or raise "
                             "--max-unavailable")
                self._wait()

    def _take_out(self, api: Api, host: str, url: str) -> None:
        t = time.monotonic()
        api.remove(url)
        self._until(lambda: routed_away(url, api.workers()), UNLIST_TIMEOUT_S,
                    f"the gateway still routes to {url} after DELETE /workers/{{id}}")
        self._step(host, "removed", url, t)
        timeout = self.stage.params.drain_timeout
        t = time.monotonic()
        readings: list[int | None] = []
        while time.monotonic() - t < timeout:
            readings.append(api.worker_in_flight(url))
            if drained(readings):
                self._step(host, "drained", f"0 requests in flight ({len(readings)} readings)", t)
                return
            self._sleep(POLL_S)
        last = readings[-1] if readings else None
        self._until(lambda: unlisted(url, api.workers()), UNLIST_TIMEOUT_S,
                    f"the gateway still lists {url} after its removal")
        api.add(url)  # put back
        why = "its /metrics did not answer (no answer is not drained)" if last is None else \
            f"it still had {last} request(s) running or queued"
        raise StageError(f"{host} was not drained {timeout:.0f}s after it left the gateway: "
                         f"{why}; it was put back", hint="raise the gateway stage's "
                         "drain_timeout, or serve /metrics (--enable-metrics)")

    def _rejoin(self, api: Api, host: str, url: str) -> None:
        t = time.monotonic()
        p = self.stage.params
        with self.cond:  # on a first deploy the gateway itself may still be on its way
            while self.gateway_host in self.wait_for and self.gateway_host not in self.done:
                self._wait()
        self._gateway_ok(f"{host} stays out of rotation")
        self._until(lambda: not draining(url, api.workers()), UNLIST_TIMEOUT_S,
                    f"the gateway still lists {url} Draining")
        before = api.worker_requests_done(url)
        api.add(url)
        self._until(lambda: listed_ready(url, api.workers()), p.ready_timeout,
                    f"the gateway did not list {url} Ready after POST /workers")
        self._step(host, "added", url, t)
        sent, ok = 0, False
        deadline = time.monotonic() + p.ready_timeout
        while True:
            sent += 1  # another prompt each time: a cache-aware policy would pin one prompt
            ok = api.chat(p.chat_model, f"Say OK ({sent}).").ok or ok
            now = api.worker_requests_done(url)
            before = now if before is None else before
            if back_in(ok, before, now):
                break
            if time.monotonic() > deadline:
                raise StageError(f"no chat through the gateway was proven to reach {url} in "
                                 f"{p.ready_timeout:.0f}s ({sent} sent, "
                                 f"{'one answered' if ok else 'none answered'}; its request "
                                 f"counter read {now})")
            self._sleep(POLL_S)
        with self.cond:
            self.taken.pop(host, None)
            self.cond.notify_all()
        self._step(host, "serving", f"a chat through the gateway reached it ({sent} sent)", t)

    def _fail(self, host: str, detail: str, since: float | None = None, *,
              out: bool = True) -> None:
        """The roll stops; HOST stays out (counted against the budget) unless it was put back
        (`out` False: no longer taken, its node's error fails it)."""
        self._step(host, "failed", detail, since)
        with self.cond:
            if not out:
                self.taken.pop(host, None)
            self.failed.add(host)
            self.cond.notify_all()
        if out:
            self.state.outcome.set(host, "roll", Status.FAILED)

    def _step(self, host: str, step: str, detail: str | None = None,
              since: float | None = None) -> None:
        self.state.bus.publish(ReplicaRoll(
            host=host, step=step, detail=detail,
            duration_s=round(time.monotonic() - since, 3) if since is not None else None))

    def _wait(self) -> None:
        """Under self.cond: wait for a change (or a poll's time)."""
        if self.state.cancelled.is_set():
            raise Interrupted("interrupted (Ctrl-C) at the fleet's gate")
        self.cond.wait(POLL_S)

    def _sleep(self, seconds: float) -> None:
        if self.state.cancelled.wait(seconds):
            raise Interrupted("interrupted (Ctrl-C) while a replica was out of rotation")

    def _until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise StageError(f"{what} (waited {timeout:.0f}s)")
            self._sleep(POLL_S)


class FleetRun:
    """Runs a plan with a gateway: every host at once, replicas through the gate."""

    def __init__(self, state: RunState, gate: FleetGate,
                 preconnected: Preconnect | None = None) -> None:
        self.state = state
        self.gate = gate
        self.walker = HostWalker(state, preconnected)
        state.gate = gate

    def run(self) -> Outcome:
        """Walk every host (every replica at once: the barrier needs each at its gate)."""
        st = self.state
        t0 = st.started()
        try:
            self.walker.walk_all(list(st.plan.hosts), then=self.gate.walked,
                                 forks=max(st.options.forks, len(st.plan.hosts)))
        except KeyboardInterrupt:
            pass  # the run was cancelled: the outcome says so (exit 130)
        finally:
            self.walker.close()
            self.gate.close()
        return st.finished(t0)


def schedule(state: RunState, preconnected: Preconnect | None = None) -> FleetRun | ParallelRun:
    """The schedule of a deploy: FleetRun when the plan holds a gateway stage, else ParallelRun;
    PlanError when the playbook has a gateway that the selection left out while it would
    restart a server (nothing could take the replicas out of rotation)."""
    if state.options.max_unavailable < 1:
        raise PlanError("--max-unavailable must be at least 1")
    found = [(h, sid, st) for (h, sid), st in state.stages.items() if st.kind == GATEWAY_KIND]
    if len(found) > 1:
        raise PlanError(f"a plan may hold one gateway stage on one host; found {len(found)}: "
                        + ", ".join(f"{h}/{sid}" for h, sid, _ in found))
    if not found:
        _refuse_ungated(state)
        return ParallelRun(state, preconnected=preconnected)
    host, sid, stage = found[0]
    inv = state.plan.inventory
    ctx = StageContext(spec=state.plan.stages[sid], run_id=state.bus.run_id,
                       log=structlog.get_logger("orchestrator.run.fleet"),
                       inventory_hosts=dict(inv.hosts), inventory_groups=inventory_groups(inv))
    return FleetRun(state, FleetGate(state, host, stage, stage.urls(ctx)), preconnected)


def _refuse_ungated(state: RunState) -> None:
    gateways = [s.id for s in state.plan.playbook.stages if s.kind == GATEWAY_KIND]
    if state.options.dry_run or not gateways:
        return
    kinds = stage_kinds()
    restarts = sorted({sid for mine in state.nodes.values() for sid, node in mine.items()
                       if node.params is not None and kinds[node.kind].disruptive})
    if restarts:
        raise PlanError(
            f"the selection restarts servers ({', '.join(restarts)}) behind the gateway "
            f"stage {gateways[0]!r} but leaves that stage out: nothing would take the "
            "replicas out of rotation", hint="keep the gateway's host in --limit and its "
            "stage in the selection (it changes nothing when converged), or use --dry-run")
