"""A rolling redeploy (`deploy --rolling [--max-unavailable N]`): replicas behind the gateway (SMG),
a few at a time, with no request lost.

The plan must hold one `gateway` stage; its worker URLs (its `worker_group`) name the
replicas. Every other host (the router's) is walked first, as a plain deploy would. Then, per
batch of at most N replicas (each replica of a batch in its own thread):

  1. refuse when taking the batch out would leave the router no healthy worker;
  2. take the replica out of the router: DELETE /workers/{id}, wait until GET /workers no longer
     lists it (the removal is an asynchronous job in SMG: the worker drains, then goes);
  3. drain: wait, bounded by the router stage's `drain_timeout`, until the replica's own
     running + queued requests (SGLang's /metrics) read 0 twice in a row - the router's removal
     does not wait for the requests it already sent there (orchestrator/sglang/gateway.py);
     a replica that does not drain in time is put back and the roll stops;
  4. run the replica's stages (its host walk, orchestrator.run.walk: its server relaunches when
     its launch fingerprint changed, wait_ready proves it ready with its accept length);
  5. put it back: POST /workers {"url"}, wait until the router lists it healthy and a chat
     completion sent through the router reached it (its own finished-requests counter grew);
     only then the next batch starts.

A failed replica stops the roll: it stays out of the router, the replicas not reached yet keep
serving untouched (their stages are reported skipped). Each step is a `roll.step` event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator.errors import OrchestratorError, PlanError, StageError
from orchestrator.events import ReplicaRoll
from orchestrator.host import Host
from orchestrator.options import RollingOptions
from orchestrator.run.state import Outcome, RunState
from orchestrator.run.walk import HostWalker
from orchestrator.stages.base import inventory_groups
from orchestrator.stages.gateway import GatewayStage, worker_urls
from orchestrator.stages.gateway.api import GatewayApi
from orchestrator.status import Status

#: consecutive zero readings of a replica's in-flight requests that count as drained
DRAINED_READINGS = 2


@dataclass(frozen=True)
class _Router:
    host: str
    stage: GatewayStage
    urls: dict[str, str]


class RollingRun:
    """Runs a plan as a rolling redeploy of the replicas behind its `gateway` stage."""

    def __init__(self, state: RunState, rolling: RollingOptions | None = None) -> None:
        self.state = state
        self.walker = HostWalker(state)
        self.rolling = rolling or RollingOptions()
        self.router = self._find_router()
        self.replicas = [h for h in state.plan.hosts if h in self.router.urls]
        if self.rolling.max_unavailable < 1:
            raise PlanError("--max-unavailable must be at least 1")
        if len(self.replicas) > 1 and self.rolling.max_unavailable >= len(self.replicas):
            raise PlanError(f"--max-unavailable {self.rolling.max_unavailable} would take all "
                            f"{len(self.replicas)} replicas out of the router at once",
                            hint=f"use at most {len(self.replicas) - 1}")

    def _find_router(self) -> _Router:
        found = [(h, st) for (h, _sid), st in self.state.stages.items()
                 if isinstance(st, GatewayStage)]
        if len(found) != 1:
            raise PlanError(f"--rolling needs exactly one gateway stage on one host in "
                            f"the plan; found {len(found)}",
                            hint="add the router's stages to the playbook (and to --limit)")
        host, stage = found[0]
        inv = self.state.plan.inventory
        return _Router(host, stage, worker_urls(stage.params, inventory_groups(inv),
                                                dict(inv.hosts)))

    # -- the walk -----------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Walk the other hosts, then the replicas batch by batch; Ctrl-C cancels cleanly."""
        st = self.state
        t0 = st.started()
        others = [h for h in st.plan.hosts if h not in self.replicas]
        try:
            if self._walk_hosts(others) and self.replicas:
                self._roll(self.replicas)
            elif self.replicas:
                st.skip(self.replicas, "the router's host did not converge")
        except KeyboardInterrupt:
            self.walker.cancel()
        finally:
            self.walker.close()
        return st.finished(t0)

    def _walk_hosts(self, hosts: list[str]) -> bool:
        """Walk hosts concurrently (as a plain deploy does); True when none failed."""
        self.walker.walk_all(hosts)
        return all(self.state.outcome.host_ok(h) for h in hosts)

    def _roll(self, replicas: list[str]) -> None:
        st, n = self.state, self.rolling.max_unavailable
        batches = [replicas[i:i + n] for i in range(0, len(replicas), n)]
        spec = st.plan.inventory.hosts[self.router.host]
        transport = st.factory(spec, on_wait=None)
        try:
            transport.connect(budget=spec.connect_budget)
        except OrchestratorError as exc:
            st.outcome.mark(self.router.host, Status.UNREACHABLE)
            st.skip(replicas, "the router's host cannot be reached: "
                    + exc.render().splitlines()[0])
            return
        try:
            # the agent multiplexes: the batch's threads share this one connection
            router_host = Host(spec, transport, dict(spec.vars), cancelled=st.cancelled)
            for i, batch in enumerate(batches):
                rest = [h for b in batches[i + 1:] for h in b]
                if st.cancelled.is_set():
                    st.skip(batch + rest, "interrupted")
                    return
                failed = self._roll_batch(router_host, batch)
                if failed:
                    st.skip(rest, "the rolling redeploy stopped: " + ", ".join(failed)
                            + " failed")
                    return
        finally:
            transport.close()

    def _roll_batch(self, router_host: Host, batch: list[str]) -> list[str]:
        """Roll the replicas of one batch concurrently; the ones that failed."""
        if self.state.options.dry_run:
            self._walk_hosts(batch)
            return []
        with ThreadPoolExecutor(max_workers=len(batch)) as ex:
            done = {h: ex.submit(self._roll_one, router_host, h, batch) for h in batch}
        return [h for h, fut in done.items() if not fut.result()]

    def _step(self, host: str, step: str, detail: str | None = None,
              since: float | None = None) -> None:
        self.state.bus.publish(ReplicaRoll(host=host, step=step, detail=detail,
                                           duration_s=round(time.monotonic() - since, 3)
                                           if since is not None else None))

    def _roll_one(self, router_host: Host, host: str, batch: list[str]) -> bool:
        """Out of the router, drained, redeployed, back in and serving; False on failure."""
        api = self.router.stage.api(router_host)
        url = self.router.urls[host]
        outcome = self.state.outcome
        try:
            self._leave(api, host, url, batch)
            t = time.monotonic()
            self.walker.walk(host)
            if not outcome.host_ok(host):
                self._step(host, "failed", "its stages failed: it stays out of the router", t)
                return False
            self._step(host, "redeployed", None, t)
            self._rejoin(api, host, url)
            return True
        except OrchestratorError as exc:
            self._step(host, "failed", exc.render().splitlines()[0])
            if not outcome.statuses.get(host):
                self.state.skip([host], f"rolling redeploy: {exc.render().splitlines()[0]}")
            outcome.set(host, "roll", Status.FAILED)
            return False

    def _leave(self, api: GatewayApi, host: str, url: str, batch: list[str]) -> None:
        """Refuse an outage, take the replica out of the router, wait for its requests."""
        listed = api.workers()
        if listed is None:
            raise StageError(f"the router at {api.base} does not answer GET /workers")
        batch_urls = {self.router.urls[h] for h in batch}
        serving = [w for w in listed if w.ready and w.url not in batch_urls]
        mine = [w for w in listed if w.url == url]
        if mine and mine[0].ready and not serving:
            raise StageError(f"taking {host} out of the router would leave it no healthy "
                             "worker", hint="bring the other replicas back first")
        t = time.monotonic()
        if api.remove(url):
            self._wait(lambda: all(w.url != url for w in api.workers() or []),
                       30.0, f"the router still lists {url} after DELETE /workers/{{id}}")
            self._step(host, "removed", url, t)
            self._drain(api, host, url)
        else:
            self._step(host, "removed", f"{url} was not in the router")

    def _drain(self, api: GatewayApi, host: str, url: str) -> None:
        timeout = self.router.stage.params.drain_timeout
        t = time.monotonic()
        zeros = 0
        last: int | None = None
        while time.monotonic() - t < timeout:
            last = api.worker_in_flight(url)
            zeros = zeros + 1 if last in (0, None) else 0
            if last is None or zeros >= DRAINED_READINGS:
                self._step(host, "drained", "no /metrics: not measured" if last is None
                           else "0 requests in flight", t)
                return
            self._sleep(0.2)
        api.add(url)
        raise StageError(f"{host} still had {last} request(s) in flight {timeout:.0f}s after "
                         "it left the router; it was put back and the roll stopped",
                         hint="raise the router stage's drain_timeout")

    def _rejoin(self, api: GatewayApi, host: str, url: str) -> None:
        """Back into the router; done once a request through the router reached THIS replica
        (its finished-requests counter grew), or - without that counter - once the router
        answers a chat completion."""
        t = time.monotonic()
        before = api.worker_requests_done(url)
        api.add(url)
        timeout = self.router.stage.params.ready_timeout
        self._wait(lambda: any(w.url == url and w.ready for w in api.workers() or []),
                   timeout, f"the router did not list {url} healthy after POST /workers")
        self._step(host, "added", url, t)
        sent = [0]

        def served() -> bool:
            sent[0] += 1  # another prompt each time: cache_aware would pin one prompt
            ok = api.chat(self.router.stage.params.chat_model, f"Say OK ({sent[0]}).").ok
            if before is None:
                return ok
            now = api.worker_requests_done(url)
            return now is not None and now > before

        self._wait(served, timeout, f"no request through the router reached {url}")
        how = "a request through the router reached it" if before is not None else \
            "the router serves a chat (the replica has no request counter)"
        self._step(host, "serving", f"{how} ({sent[0]} sent)", t)

    def _wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise StageError(f"{what} (waited {timeout:.0f}s)")
            self._sleep(0.1)

    def _sleep(self, seconds: float) -> None:
        if self.state.cancelled.wait(seconds):
            raise StageError("interrupted (Ctrl-C) during the rolling redeploy")

