"""The `sglang_router` stage kind: SGLang's own router (PyPI `sglang-router`) in front of replicas.

Example: playbooks/kimi-k2.6-router.yaml; every param is described in its Params model.

check: converged when the router recorded in `state_dir` is alive (not a recycled pid) with the
same FINGERPRINT (launch arguments - worker URLs and policy included -, environment, the venv's
sglang-router version) and answers /health. Before a launch the installed router's own argument
parsing and validation run in its venv (orchestrator/remote/router_check.py), so a launch it
would refuse fails the stage while the old router still serves. The pin (fact "pin",
RouterPin): {sglang_router_version, policy, extra_args, bind}; under `deploy --locked` a router
that would differ is refused in check (worker URLs are per environment and not pinned).

apply: stops the previous router (SIGTERM to its process group, SIGKILL after `stop_timeout`)
and starts `python -m sglang_router.launch_router --host H --port P --policy X --worker-urls
URL...` under the same supervisor as the SGLang server (orchestrator/remote/supervisor.py,
through the `server_start` action).

verify, bounded by `ready_timeout`: the router's /health answers, GET /workers lists every
worker URL healthy, then a chat completion through the router answers 200; a router that exited
fails at once, with its log. What the router does is read from its real code (cited in
orchestrator/sglang/router.py); the calls of its API are this package's api.py.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from orchestrator.config.model import parse_duration
from orchestrator.errors import StageError
from orchestrator.facts.programs import marked_result
from orchestrator.facts.pyenv import VenvInventory, venv_of
from orchestrator.facts.server import ServerStatus
from orchestrator.host import Host
from orchestrator.pinfile import StagePin
from orchestrator.remote import source
from orchestrator.sglang import router as rt
from orchestrator.sglang.api import local_url
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.pin import bind_scope, differs, pinned
from orchestrator.stages.sglang_router.api import RouterApi
from orchestrator.stages.sglang_server import change, rules
from orchestrator.stages.sglang_server.layout import ServerLayout

#: the installed router's own argument check, run by the venv's python (a real module, shipped)
_CHECK_SCRIPT = source("router_check")


class SGLangRouterParams(Params):
    """Parameters of the sglang_router kind."""

    python: str = Field(description="the router venv's python (has sglang-router installed)")
    workers: list[str] = Field(default_factory=list, description="worker URLs")
    worker_group: str | None = Field(None, description="inventory group: a worker per host")
    worker_port: int = Field(30000, ge=1, le=65535, description="the workers' port")
    worker_scheme: str = Field("http", pattern=r"^https?$")
    policy: str = Field("round_robin", description="--policy: " + ", ".join(rt.POLICIES))
    host: str = Field("127.0.0.1", description="--host (address the router binds)")
    port: int = Field(30080, ge=1, le=65535, description="--port")
    extra_args: list[str] = Field(default_factory=list, description="more launcher arguments")
    env: dict[str, str] = Field(default_factory=dict)
    state_dir: str = Field(description="pid file, log, fingerprint, launch spec")
    chat_model: str | None = Field(None, description="model of the readiness chat completion")
    ready_timeout: float = Field(300.0, description="how long verify waits for the workers")
    poll_interval: float = 0.5
    stop_timeout: float = Field(30.0, description="SIGTERM grace before SIGKILL")
    drain_timeout: float = Field(300.0, description="deploy --rolling: longest wait for a "
                                 "replica's in-flight requests after it left the router")
    native_check: bool = Field(True, description="run the installed router's own argument "
                               "parsing before a launch (before the old router is stopped)")
    #: sglang_server's change helpers read these (the router never takes a foreign port over)
    stop_stale: bool = False

    @field_validator("ready_timeout", "poll_interval", "stop_timeout", "drain_timeout",
                     mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in rt.POLICIES:  # router_args.py:249 (argparse choices)
            raise ValueError(f"policy must be one of {', '.join(rt.POLICIES)}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _some_workers(self) -> SGLangRouterParams:
        if not self.workers and not self.worker_group:
            raise ValueError("give `workers:` (URLs) or `worker_group:` (an inventory group)")
        return self


@dataclass(frozen=True)
class RouterPin(StagePin):
    """sglang_router's pin: the router's version, policy, extra arguments and bind scope."""

    sglang_router_version: str | None
    policy: str | None
    extra_args: tuple[str, ...] | None
    bind: str | None


def worker_urls(p: SGLangRouterParams, groups: dict[str, list[str]],
                hosts: dict[str, Any]) -> dict[str, str]:
    """Worker URL per inventory host of `worker_group` (then the literal `workers`, keyed by
    URL): http://ADDRESS:worker_port, ADDRESS being the host's address (else its name)."""
    out: dict[str, str] = {}
    if p.worker_group:
        if p.worker_group not in groups:
            raise StageError(f"worker_group {p.worker_group!r} is not an inventory group",
                             hint="known groups: " + ", ".join(sorted(groups)))
        for name in groups[p.worker_group]:
            spec = hosts.get(name)
            address = getattr(spec, "address", None) or name
            out[name] = f"{p.worker_scheme}://{address}:{p.worker_port}"
    for url in p.workers:
        out.setdefault(rt.norm_url(url), rt.norm_url(url))
    return out


class SGLangRouter(Stage, kind="sglang_router"):
    """Run SGLang's router on its host, supervised and fingerprinted like the server."""

    Params = SGLangRouterParams
    params: SGLangRouterParams
    Pin = RouterPin

    @property
    def _layout(self) -> ServerLayout:
        return ServerLayout(self.params.state_dir)

    def urls(self, ctx: StageContext) -> dict[str, str]:
        """Inventory host (or URL) -> worker URL."""
        return worker_urls(self.params, ctx.inventory_groups, ctx.inventory_hosts)

    def api(self, host: Host) -> RouterApi:
        """The router's API, from its own host."""
        return RouterApi(host, local_url(self.params.host, self.params.port))

    def _desired(self, host: Host, ctx: StageContext) -> tuple[list[str], dict[str, Any]]:
        p = self.params
        args = rt.router_args(self.urls(ctx).values(), policy=p.policy, host=p.host,
                              port=p.port, extra_args=p.extra_args)
        venv = venv_of(p.python)
        version = None
        if venv is not None:
            inv = host.fact(VenvInventory, path=venv, names=["sglang-router"])
            version = (inv.versions or {}).get("sglang-router")
        parts = {"python": p.python, "args": args, "sglang_router": version,
                 "env": {k: hashlib.sha256(f"{k}={v}".encode()).hexdigest()[:16]
                         for k, v in sorted(p.env.items())}}
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return args, {"fingerprint": digest, "parts": parts}

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Converged when our router runs with the same fingerprint and answers /health."""
        p = self.params
        args, fp = self._desired(host, ctx)
        ctx.record("workers", list(self.urls(ctx).values()))
        entry = RouterPin(fp["parts"]["sglang_router"], p.policy, tuple(p.extra_args),
                          bind_scope(p.host))
        ctx.record("pin", entry.to_json())
        drift = self._check_pin(ctx, entry)
        if drift is not None:
            return drift
        status = host.fact(ServerStatus, state_dir=p.state_dir, host=p.host, port=p.port)
        if status.foreign_listener is not None:
            who = rules.describe_foreign(status.foreign_listener)
            raise StageError(f"a process not started by us ({who}) holds {p.host}:{p.port}",
                             hint="stop it, or give the router another port")
        verdict = rules.server_verdict(status, fp, port=p.port, restart_after=p.ready_timeout)
        if verdict.converged:
            return Converged(verdict.reason.replace("wait_ready", "verify"))
        reason = verdict.reason
        if not p.native_check or fp["parts"]["sglang_router"] is None:
            reason += "; the router's own argument check deferred (sglang-router not installed yet)"
        else:
            self._native_check(host, args)
        return Needed(reason, plan=(status, args, fp))

    @staticmethod
    def _check_pin(ctx: StageContext, entry: RouterPin) -> Needed | None:
        """`deploy --locked`: the router's version, policy, extra arguments and bind scope must
        be the pinned ones (worker URLs are per environment, so not pinned)."""
        pin = pinned(ctx, RouterPin)
        if not isinstance(pin, RouterPin):
            return pin
        want = pin.to_json()
        # a value not known yet (a version not installed: its stage installs it) is not compared
        for key, value in entry.to_json().items():
            if value is not None and want[key] is not None and want[key] != value:
                return differs(ctx, key, value, want[key])
        return None

    def _native_check(self, host: Host, args: list[str]) -> None:
        """The installed router's own parser and validation refuse a bad launch BEFORE the
        running router is stopped (orchestrator/remote/router_check.py)."""
        p = self.params
        r = host.run_argv([p.python, "-c", _CHECK_SCRIPT, json.dumps(args)], timeout=120)
        try:
            got = marked_result(r.stdout)
        except ValueError:
            got = None
        if not isinstance(got, dict):
            raise StageError(f"the router's own argument check gave no answer: {r.tail(3)}")
        if got.get("available") and not got.get("ok"):
            raise StageError(f"sglang-router refuses the launch ({got.get('kind')}): "
                             f"{got.get('message')}",
                             hint="fix the router stage's parameters (extra_args, policy); "
                             "the running router was left as it is")

    def apply(self, host: Host, ctx: StageContext, plan: Any = None) -> None:
        """Stop the previous router, write the launch files, start the supervisor."""
        p = self.params
        if plan is None:
            verdict = self.check(host, ctx)
            if isinstance(verdict, Converged):
                return
            plan = verdict.plan
        status, args, fp = plan
        change.stop_previous(host, ctx, p, status)
        layout = self._layout
        spec = {"argv": [p.python, "-m", rt.LAUNCH_MODULE, *args], "env": dict(p.env),
                "log": layout.log, "pid_file": layout.pid, "exit_file": layout.exit,
                "key_file": None, "fingerprint": fp["fingerprint"], "cwd": p.state_dir,
                "mkdirs": [], "managed_by": "background", "unit": None,
                "host": p.host, "port": p.port}
        host.run_argv(["mkdir", "-p", p.state_dir], check=True, timeout=30, what="mkdir")
        host.write_file(layout.launch, json.dumps(spec, indent=1) + "\n", mode=0o600)
        host.write_file(layout.fingerprint, json.dumps(fp, indent=1) + "\n", mode=0o600)
        pidfile = change.start_background(host, p, "router")
        ctx.record("pid", pidfile.pid if pidfile else None)
        ctx.record("fingerprint", fp["fingerprint"][:16])
        ctx.record("log", layout.log)
        ctx.record("sglang_router_version", fp["parts"]["sglang_router"])

    def verify(self, host: Host, ctx: StageContext) -> None:
        """Bounded: the router answers, lists every worker healthy, and serves a chat."""
        p = self.params
        want = set(self.urls(ctx).values())
        api = self.api(host)
        deadline = time.monotonic() + p.ready_timeout
        why = "not polled yet"
        while time.monotonic() < deadline:
            st = host.fact(ServerStatus, state_dir=p.state_dir, log_lines=30)
            if not st.running:
                tail = "\n".join(st.log_tail) or "(the log is empty)"
                raise StageError(f"the router exited; last lines of {st.log_path}:\n"
                                 f"{change.indent(tail)}")
            why = self._not_ready(api, want)
            if why is None:
                ctx.record("ready_workers", sorted(want))
                return
            ctx.progress(f"router: {why}")
            ctx.sleep(p.poll_interval)
        raise StageError(f"the router on {api.base} was not ready after "
                         f"{p.ready_timeout:.0f}s: {why}",
                         hint=f"see the router's log {self._layout.log} and the workers")

    def _not_ready(self, api: RouterApi, want: set[str]) -> str | None:
        """Why the router does not serve yet (None: it does)."""
        health = api.health()
        if not health.ok:
            return f"/health {health.what}"
        listed = api.workers()
        if listed is None:
            return "GET /workers does not answer"
        healthy = {w.url for w in listed if w.healthy}
        missing = sorted(want - healthy)
        if missing:
            return "workers not listed healthy: " + ", ".join(missing)
        chat = api.chat(self.params.chat_model)
        if not chat.ok:
            return f"chat completion through the router: {chat.what} {chat.body[:200]}"
        return None
