"""A rolling redeploy (`deploy --rolling [--max-unavailable N]`): replicas behind SGLang's router,
a few at a time, with no request lost.

The plan must hold one `sglang_router` stage; its worker URLs (its `worker_group`) name the
replicas. Every other host (the router's) is walked first, as a plain deploy would. Then, per
batch of at most N replicas (each replica of a batch in its own thread):

  1. refuse when taking the batch out would leave the router no healthy worker;
  2. take the replica out of the router: DELETE /workers/{id}, wait until GET /workers no longer
     lists it (the removal is an asynchronous job in sglang-router 0.3.2);
  3. drain: wait, bounded by the router stage's `drain_timeout`, until the replica's own
     running + queued requests (SGLang's /metrics) read 0 twice in a row - the router's removal
     does not wait for the requests it already sent there (orchestrator/sglang/router.py);
     a replica that does not drain in time is put back and the roll stops;
  4. run the replica's stages (the plain runner's walk of that host: its server relaunches when
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

import structlog

from orchestrator.errors import OrchestratorError, PlanError, StageError
from orchestrator.events import EventBus, ReplicaRoll, RunFinished, RunStarted
from orchestrator.host import Host
from orchestrator.plan import RenderedPlan
from orchestrator.redact import REDACTOR, Redactor
from orchestrator.runner import Outcome, Runner, RunOptions, TransportFactory
from orchestrator.stages.base import inventory_groups
from orchestrator.stages.sglang_router import SGLangRouter, worker_urls
from orchestrator.stages.sglang_router.api import RouterApi
from orchestrator.transports import make_transport

log = structlog.get_logger("orchestrator.rolling")

#: consecutive zero readings of a replica's in-flight requests that count as drained
DRAINED_READINGS = 2


@dataclass(frozen=True)
class RollingOptions:
    """`--rolling` knobs: how many replicas may be out of the router at once."""

    max_unavailable: int = 1


@dataclass(frozen=True)
class _Router:
    host: str
    stage: SGLangRouter
    urls: dict[str, str]


class RollingRunner(Runner):
    """Runs a plan as a rolling redeploy of the replicas behind its `sglang_router` stage."""

    def __init__(self, rendered: RenderedPlan, bus: EventBus, *,
                 rolling: RollingOptions | None = None, options: RunOptions | None = None,
                 transport_factory: TransportFactory = make_transport,
                 redactor: Redactor = REDACTOR) -> None:
        super().__init__(rendered, bus, options=options, transport_factory=transport_factory,
                         redactor=redactor)
        self.rolling = rolling or RollingOptions()
        self.router = self._find_router()
        self.replicas = [h for h in self.plan.hosts if h in self.router.urls]
        if self.rolling.max_unavailable < 1:
            raise PlanError("--max-unavailable must be at least 1")
        if len(self.replicas) > 1 and self.rolling.max_unavailable >= len(self.replicas):
            raise PlanError(f"--max-unavailable {self.rolling.max_unavailable} would take all "
                            f"{len(self.replicas)} replicas out of the router at once",
                            hint=f"use at most {len(self.replicas) - 1}")

    def _find_router(self) -> _Router:
        found = [(h, sid, st) for (h, sid), st in self._stages.items()
                 if isinstance(st, SGLangRouter)]
        if len(found) != 1:
            raise PlanError(f"--rolling needs exactly one sglang_router stage on one host in "
                            f"the plan; found {len(found)}",
                            hint="add the router's stages to the playbook (and to --limit)")
        host, _sid, stage = found[0]
        inv = self.plan.inventory
        urls = worker_urls(stage.params, inventory_groups(inv), dict(inv.hosts))
        return _Router(host, stage, urls)

    # -- the walk -----------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Walk the other hosts, then the replicas batch by batch; Ctrl-C cancels cleanly."""
        self.bus.publish(RunStarted(
            hosts=list(self.plan.hosts), stages=list(self.plan.stages),
            nodes=self.plan.node_count, dry_run=self.options.dry_run, forks=self.options.forks))
        t0 = time.monotonic()
        others = [h for h in self.plan.hosts if h not in self.replicas]
        try:
            ok = self._walk_hosts(others)
            if ok and self.replicas:
                self._roll(self.replicas)
            elif self.replicas:
                self._skip_all(self.replicas, "the router's host did not converge")
        except KeyboardInterrupt:
            self.cancel()
        finally:
            for p in list(self._pools.values()):
                p.close()
        self.bus.publish(RunFinished(exit_code=self.outcome.exit_code,
                                     duration_s=round(time.monotonic() - t0, 3)))
        return self.outcome

    def _walk_hosts(self, hosts: list[str]) -> bool:
        """Run hosts concurrently (the plain runner's per-host walk); True when none failed."""
        if not hosts:
            return True
        with ThreadPoolExecutor(max_workers=max(1, min(self.options.forks, len(hosts))),
                                thread_name_prefix="host") as ex:
            list(ex.map(self._run_host, hosts))
        return all(self._host_ok(h) for h in hosts)

    def _host_ok(self, host: str) -> bool:
        statuses = self.outcome.statuses.get(host, {})
        return host not in self.outcome.unreachable and host not in self.outcome.locked and \
            not any(s in ("failed", "interrupted") for s in statuses.values())

    def _skip_all(self, hosts: list[str], reason: str) -> None:
        for h in hosts:
            for sid in self.nodes.get(h, {}):
                self._end_stage(h, sid, "skipped", 0.0, reason=reason)

    def _roll(self, replicas: list[str]) -> None:
        n = self.rolling.max_unavailable
        batches = [replicas[i:i + n] for i in range(0, len(replicas), n)]
        spec = self.plan.inventory.hosts[self.router.host]
        transport = self.factory(spec, on_wait=None)
        try:
            transport.connect(budget=spec.connect_budget)
        except OrchestratorError as exc:
            with self._lock:
                self.outcome.unreachable.add(self.router.host)
            self._skip_all(replicas, "the router's host cannot be reached: "
                           + exc.render().splitlines()[0])
            return
        try:
            # the agent multiplexes: the batch's threads share this one connection
            router_host = Host(spec, transport, dict(spec.vars), cancelled=self._cancel)
            for i, batch in enumerate(batches):
                rest = [h for b in batches[i + 1:] for h in b]
                if self._cancel.is_set():
                    self._skip_all(batch + rest, "interrupted")
                    return
                failed = self._roll_batch(router_host, batch)
                if failed:
                    self._skip_all(rest, "the rolling redeploy stopped: "
                                   + ", ".join(failed) + " failed")
                    return
        finally:
            transport.close()

    def _roll_batch(self, router_host: Host, batch: list[str]) -> list[str]:
        """Roll the replicas of one batch concurrently; the ones that failed."""
        if self.options.dry_run:
            self._walk_hosts(batch)
            return []
        with ThreadPoolExecutor(max_workers=len(batch)) as ex:
            done = {h: ex.submit(self._roll_one, router_host, h, batch) for h in batch}
        return [h for h, fut in done.items() if not fut.result()]

    def _step(self, host: str, step: str, detail: str | None = None,
              since: float | None = None) -> None:
        self.bus.publish(ReplicaRoll(host=host, step=step, detail=detail,
                                     duration_s=round(time.monotonic() - since, 3)
                                     if since is not None else None))

    def _roll_one(self, router_host: Host, host: str, batch: list[str]) -> bool:
        """Out of the router, drained, redeployed, back in and serving; False on failure."""
        api = self.router.stage.api(router_host)
        url = self.router.urls[host]
        try:
            self._leave(api, host, url, batch)
            t = time.monotonic()
            self._run_host(host)
            if not self._host_ok(host):
                self._step(host, "failed", "its stages failed: it stays out of the router", t)
                return False
            self._step(host, "redeployed", None, t)
            self._rejoin(api, host, url)
            return True
        except OrchestratorError as exc:
            self._step(host, "failed", exc.render().splitlines()[0])
            if not self.outcome.statuses.get(host):
                self._skip_all([host], f"rolling redeploy: {exc.render().splitlines()[0]}")
                with self._lock:
                    self.outcome.statuses.setdefault(host, {})["roll"] = "failed"
            else:
                with self._lock:
                    self.outcome.statuses[host]["roll"] = "failed"
            return False

    def _leave(self, api: RouterApi, host: str, url: str, batch: list[str]) -> None:
        """Refuse an outage, take the replica out of the router, wait for its requests."""
        listed = api.workers()
        if listed is None:
            raise StageError(f"the router at {api.base} does not answer GET /workers")
        batch_urls = {self.router.urls[h] for h in batch}
        serving = [w for w in listed if w.healthy and w.url not in batch_urls]
        mine = [w for w in listed if w.url == url]
        if mine and mine[0].healthy and not serving:
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

    def _drain(self, api: RouterApi, host: str, url: str) -> None:
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

    def _rejoin(self, api: RouterApi, host: str, url: str) -> None:
        """Back into the router; done once a request through the router reached THIS replica
        (its finished-requests counter grew), or - without that counter - once the router
        answers a chat completion."""
        t = time.monotonic()
        before = api.worker_requests_done(url)
        api.add(url)
        timeout = self.router.stage.params.ready_timeout
        self._wait(lambda: any(w.url == url and w.healthy for w in api.workers() or []),
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
        if self._cancel.wait(seconds):
            raise StageError("interrupted (Ctrl-C) during the rolling redeploy")

