"""The `gateway` stage kind: SMG, the Shepherd Model Gateway (PyPI `smg`), in front of replicas.

Example: playbooks/kimi-k2.6-fleet.yaml; every param is described in its Params model. What SMG
does is read from its real code (smg 1.13.0, cited in orchestrator/sglang/gateway.py); the calls
of its API are this package's api.py, the changes change.py.

check: Converged when the gateway recorded in `state_dir` is alive with the same FINGERPRINT
(smg's args without worker URLs, smg's version, env and key hashes), answers /health and GET
/workers lists exactly the desired workers (`worker_group`: one per inventory host, and
`workers`), each Ready. The pin (fact "pin", GatewayPin): {smg_version, policy, extra_args, bind}.

apply: a launch is first judged by smg's own parser and validation, then PROBE-STARTED on a
spare loopback port (the Rust RouterConfig::validate() runs only at start:
remote/gateway_launch.py check); a refusal fails the stage and leaves the old gateway serving.
Then the old one stops and `GATEWAY_PY STATE/gateway_launch.py run STATE/gateway.json` starts
under the supervisor (restart on failure, both keys masked). The keys never reach an argv:
`api_key` (clients send it, and SMG sends it to the replicas, which must share it) and
`control_plane_key` (worker management) are 0600 files read by the launcher. Membership goes
through the API: POST /workers {"url", "api_key"} for a missing replica whose OWN /health
answers 200 from the gateway's host, DELETE for one not desired; gateway.json's worker list is
rewritten so a restarted gateway comes back with the desired set. verify (bounded by
`ready_timeout`) reconciles each poll until the members are Ready and a chat answers 200.

Binding: 127.0.0.1 by default; a non-loopback `host` is refused unless both keys are set.

The settings for a killed replica (target: SIGKILL of one replica under load costs <= 3 s and
<= 1 failed request), from smg 1.13.0's code:
- `health_check_interval` 1 s (default 60), `health_failure_threshold` 2 (default 3): SMG probes
  each worker every interval and moves it to NotReady after that many failures in a row
  (wheel smg/router_args.py:160-167, 1840-1872; a NotReady worker is kept and probed again:
  crates/protocols/src/worker.rs:146-156); a killed replica refuses connections at once,
  so it leaves routing after about 2 s instead of up to 3 minutes. 0 is refused by
  model_gateway/src/config/validation.rs:1700-1741 (a busy loop), so 1 is the floor.
- `health_check_timeout` 3 s (default 5): a failure for a hung replica within the window; not
  1 s, since SGLang's /health runs a generation and a loaded replica must not flap.
- `health_success_threshold` 2 (default): back in after 2 good probes (~2 s).
- `retry_max_retries` 5 (default), `retry_max_backoff_ms` 1000 (default 30 000): a request
  that meets the dead replica (connect refused: transient, charged once to that worker;
  model_gateway/src/routers/common/attempt_ledger.rs:1-19) is replayed on another worker,
  backoff from 50 ms x1.5 (router_args.py:155-159, 1770-1804); the cap keeps a replay inside
  the window. Beside this the transport veto (`--worker-stall-secs` 2, kept) excludes a worker
  whose connections fail (model_gateway/src/worker/liveness.rs:1-17; router_args.py:322, 815-824).
- `cb_failure_threshold` 3 (default 10, the figure behind NVIDIA-NeMo/RL#3613's ten failures),
  `cb_window` 10 s, `cb_timeout` 5 s (default 60: an open breaker must not keep a replica that
  came back out for a minute), `cb_success_threshold` 1 (router_args.py:172-177, 1806-1837).
- `startup_check_interval` 1 s (default 30): a listed replica still loading joins within a
  second of answering (router_args.py:1214-1218).
What no setting saves: a stream already under way on the killed replica (its bytes reached the
client, so it cannot be replayed).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from orchestrator.config.model import Duration
from orchestrator.errors import StageError
from orchestrator.facts.pyenv import VenvInventory, venv_of
from orchestrator.facts.server import ServerStatus
from orchestrator.host import Host
from orchestrator.pinfile import StagePin
from orchestrator.sglang import gateway as gw
from orchestrator.sglang.api import local_url
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.gateway import change
from orchestrator.stages.gateway.api import GatewayApi
from orchestrator.stages.gateway.change import Desired
from orchestrator.stages.pin import bind_scope, differs, pinned
from orchestrator.stages.sglang_server import change as server_change
from orchestrator.stages.sglang_server import rules


class GatewayParams(Params):
    """Parameters of the gateway kind."""

    python: str = Field(description="the gateway venv's python (has smg installed)")
    workers: list[str] = Field(default_factory=list, description="worker URLs")
    worker_group: str | None = Field(None, description="inventory group: a worker per host")
    worker_port: int = Field(30000, ge=1, le=65535, description="the workers' port")
    worker_scheme: str = Field("http", pattern=r"^https?$")
    policy: str = Field("round_robin", description="--policy: " + ", ".join(gw.POLICIES))
    host: str = Field("127.0.0.1", description="--host (and the metrics listener's host)")
    port: int = Field(30080, ge=1, le=65535, description="--port")
    prometheus_port: int | None = Field(None, ge=1, le=65535, description="default port + 1")
    api_key: str | None = Field(None, description="SECRET: clients' key AND the replicas' key")
    control_plane_key: str | None = Field(None, description="SECRET: /workers (admin) key")
    health_check_interval: int = Field(1, ge=1)
    health_check_timeout: int = Field(3, ge=1)
    health_failure_threshold: int = Field(2, ge=1)
    health_success_threshold: int = Field(2, ge=1)
    retry_max_retries: int = Field(5, ge=0)
    retry_max_backoff_ms: int = Field(1000, ge=1)
    cb_failure_threshold: int = Field(3, ge=1)
    cb_success_threshold: int = Field(1, ge=1)
    cb_timeout: int = Field(5, ge=1)
    cb_window: int = Field(10, ge=1)
    startup_check_interval: int = Field(1, ge=1)
    extra_args: list[str] = Field(default_factory=list, description="more `smg launch` args")
    env: dict[str, str] = Field(default_factory=dict)
    state_dir: str = Field(description="pid file, log, fingerprint, keys, launch files")
    chat_model: str | None = Field(None, description="model of the readiness chat completion")
    ready_timeout: Duration = Field(300.0, description="how long verify waits for the workers")
    probe_timeout: Duration = Field(60.0, description="the probe start's wait for /health")
    poll_interval: Duration = 0.5
    stop_timeout: Duration = Field(30.0, description="SIGTERM grace before SIGKILL")
    drain_timeout: Duration = Field(300.0, description="longest wait for a replica's in-flight "
                                 "requests after it left the gateway")
    #: sglang_server's change helpers read this (the gateway never takes a foreign port over)
    stop_stale: bool = False

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("api_key", "control_plane_key", mode="before")
    @classmethod
    def _key(cls, v: Any) -> Any:
        return v or None  # an unset environment variable (`!env X:-`) is no key

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in gw.POLICIES:  # router_args.py:571-574 (argparse choices)
            raise ValueError(f"policy must be one of {', '.join(gw.POLICIES)}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _exposure(self) -> GatewayParams:
        if not self.workers and not self.worker_group:
            raise ValueError("give `workers:` (URLs) or `worker_group:` (an inventory group)")
        if bind_scope(self.host) != "loopback" and not (self.api_key and self.control_plane_key):
            raise ValueError(
                f"host {self.host!r} is not a loopback address: the gateway would take prompts "
                "and worker changes from the network, so it needs both `api_key` (clients and "
                "replicas; the playbook's SGLANG_API_KEY) and `control_plane_key` (worker "
                "management; ORCHESTRATOR_GATEWAY_ADMIN_KEY), or bind 127.0.0.1")
        return self

    def settings(self) -> dict[str, int]:
        """The health, retry, breaker and startup settings, by param name (gw.SETTING_FLAGS)."""
        return {name: getattr(self, name) for name in gw.SETTING_FLAGS}


@dataclass(frozen=True)
class GatewayPin(StagePin):
    """gateway's pin: smg's version, the policy, extra arguments and the bind scope."""

    smg_version: str | None
    policy: str | None
    extra_args: tuple[str, ...] | None
    bind: str | None


def worker_urls(p: GatewayParams, groups: dict[str, list[str]],
                hosts: dict[str, Any]) -> dict[str, str]:
    """Worker URL per inventory host of `worker_group` (then the literal `workers`, keyed by
    URL): SCHEME://ADDRESS:worker_port, ADDRESS being the host's address (else its name)."""
    out: dict[str, str] = {}
    if p.worker_group:
        if p.worker_group not in groups:
            raise StageError(f"worker_group {p.worker_group!r} is not an inventory group",
                             hint="known groups: " + ", ".join(sorted(groups)))
        for name in groups[p.worker_group]:
            address = getattr(hosts.get(name), "address", None) or name
            out[name] = f"{p.worker_scheme}://{address}:{p.worker_port}"
    for url in p.workers:
        out.setdefault(gw.norm_url(url), gw.norm_url(url))
    return out


def _digest(text: str | None) -> str | None:
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text else None


@dataclass(frozen=True)
class _Plan:
    kind: str  # "launch" or "members"
    desired: Desired
    status: ServerStatus | None = None


class GatewayStage(Stage, kind="gateway"):
    """Run SMG on its host, supervised and fingerprinted, its membership reconciled."""

    Params = GatewayParams
    params: GatewayParams
    Pin = GatewayPin

    def urls(self, ctx: StageContext) -> dict[str, str]:
        """Inventory host (or URL) -> worker URL."""
        return worker_urls(self.params, ctx.inventory_groups, ctx.inventory_hosts)

    def api(self, host: Host) -> GatewayApi:
        """The gateway's API from its own host, with the stage's keys."""
        p = self.params
        return GatewayApi(host, local_url(p.host, p.port), p.api_key, p.control_plane_key)

    def _desired(self, host: Host, ctx: StageContext) -> Desired:
        p = self.params
        args = gw.gateway_args(host=p.host, port=p.port, policy=p.policy,
                               prometheus_port=p.prometheus_port or p.port + 1,
                               settings=p.settings(), extra_args=p.extra_args)
        venv = venv_of(p.python)
        inv = host.fact(VenvInventory, path=venv, names=[gw.PACKAGE]) if venv is not None else None
        version = (inv.versions or {}).get(gw.PACKAGE) if inv is not None else None
        parts = {"python": p.python, "args": args, "smg": version,  # hashes: no key written
                 "keys": {k: _digest(getattr(p, k)) for k in ("api_key", "control_plane_key")},
                 "env": {k: _digest(f"{k}={v}") for k, v in sorted(p.env.items())}}
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return Desired(args, self.urls(ctx), {"fingerprint": digest, "parts": parts}, version)

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Converged when our gateway runs with the same fingerprint, answers /health and lists
        exactly the desired workers, each Ready."""
        p = self.params
        desired = self._desired(host, ctx)
        ctx.record("workers", list(desired.urls.values()))
        entry = GatewayPin(desired.version, p.policy, tuple(p.extra_args), bind_scope(p.host))
        ctx.record("pin", entry.to_json())
        drift = self._check_pin(ctx, entry)
        if drift is not None:
            return drift
        status = host.fact(ServerStatus, state_dir=p.state_dir, host=p.host, port=p.port)
        if status.foreign_listener is not None:
            who = rules.describe_foreign(status.foreign_listener)
            raise StageError(f"a process not started by us ({who}) holds {p.host}:{p.port}",
                             hint="stop it, or give the gateway another port")
        verdict = rules.server_verdict(status, desired.fingerprint, port=p.port,
                                       restart_after=30.0)
        if not verdict.converged:
            reason = verdict.reason
            if desired.version is None:
                reason += "; smg's own launch check deferred (smg not installed yet)"
            else:
                change.native_check(host, p, desired, probe=False)
            return Needed(reason, plan=_Plan("launch", desired, status))
        listed = self.api(host).workers()
        if listed is None:
            return Needed("the gateway runs but GET /workers does not answer",
                          plan=_Plan("members", desired))
        diff = gw.membership(listed, desired.urls.values())
        if diff:
            return Needed(diff.reason, plan=_Plan("members", desired))
        n = len(desired.urls)
        return Converged(f"{verdict.reason.replace('wait_ready', 'verify')}; "
                         f"members {n}/{n} Ready")

    @staticmethod
    def _check_pin(ctx: StageContext, entry: GatewayPin) -> Needed | None:
        """`deploy --locked`: smg's version, the policy, extra arguments and bind scope must
        be the pinned ones (worker URLs are per environment, so not pinned)."""
        pin = pinned(ctx, GatewayPin)
        if not isinstance(pin, GatewayPin):
            return pin
        want = pin.to_json()
        for key, value in entry.to_json().items():
            if value is not None and want[key] is not None and want[key] != value:
                return differs(ctx, key, value, want[key])
        return None

    def apply(self, host: Host, ctx: StageContext, plan: Any = None) -> None:
        """A launch: probe-start it, stop the old gateway, start the new one; a membership
        change: add and remove workers through the API."""
        p = self.params
        if plan is None:
            verdict = self.check(host, ctx)
            if isinstance(verdict, Converged):
                return
            plan = verdict.plan
        if plan.kind == "members":
            change.write_spec(host, p, plan.desired)
            ctx.record("membership", change.reconcile(self.api(host),
                                                      list(plan.desired.urls.values())))
            return
        ctx.progress("smg: probe start of the new launch on a spare loopback port")
        change.native_check(host, p, plan.desired, probe=True)
        server_change.stop_previous(host, ctx, p, plan.status)
        change.write_launch(host, p, plan.desired)
        pidfile = server_change.start_background(host, p, "gateway")
        ctx.record("pid", pidfile.pid if pidfile else None)
        ctx.record("fingerprint", plan.desired.fingerprint["fingerprint"][:16])
        ctx.record("log", change.ServerLayout(p.state_dir).log)
        ctx.record("smg_version", plan.desired.version)

    def verify(self, host: Host, ctx: StageContext) -> None:
        """Bounded: reconcile, then the gateway answers, lists exactly the desired workers
        Ready, and serves a chat."""
        p = self.params
        want = list(self.urls(ctx).values())
        api = self.api(host)
        deadline = time.monotonic() + p.ready_timeout
        why, done = "not polled yet", []
        while time.monotonic() < deadline:
            st = host.fact(ServerStatus, state_dir=p.state_dir, log_lines=30)
            if not st.running:
                tail = "\n".join(st.log_tail) or "(the log is empty)"
                raise StageError(f"the gateway exited; last lines of {st.log_path}:\n"
                                 f"{server_change.indent(tail)}")
            done += [d for d in change.reconcile(api, want) if d not in done]
            why = self._not_ready(api, want)
            if why is None:
                ctx.record("ready_workers", sorted(want))
                if done:
                    ctx.record("membership", done)
                return
            ctx.progress(f"gateway: {why}")
            ctx.sleep(p.poll_interval)
        raise StageError(f"the gateway on {api.base} was not ready after "
                         f"{p.ready_timeout:.0f}s: {why}",
                         hint=f"see the gateway's log {change.ServerLayout(p.state_dir).log} "
                         "and the workers")

    def _not_ready(self, api: GatewayApi, want: list[str]) -> str | None:
        """Why the gateway does not serve yet (None: it does)."""
        health = api.health()
        if not health.ok:
            return f"/health {health.what}"
        listed = api.workers()
        if listed is None:
            return "GET /workers does not answer"
        diff = gw.membership(listed, want)
        if diff:
            return diff.reason
        chat = api.chat(self.params.chat_model)
        if not chat.ok:
            return f"chat completion through the gateway: {chat.what} {chat.body[:200]}"
        return None
