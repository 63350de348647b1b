"""The `wait_ready` stage kind: wait for SGLang to serve, then prove it serves the right thing.

Example: playbooks/kimi-k2.6-eagle3.yaml; every param is described in its Params model.

Polls FROM THE HOST through the agent's `http` probe (which asks again every 0.1 s for one
poll interval, so readiness is seen at once): connection refused (weights loading) or 503
(warming up) mean "still starting"; the console shows the elapsed time and the server's latest
log line at every poll. If the server PROCESS is gone it fails at once with the last 50 log
lines, never waiting out the timeout. Once /health answers 200 it checks /model_info
architectures; one one-token request within `first_token_timeout` (a dead or hung scheduler
behind a /health 200, sglang#6624, is named; a slow first answer, kernels compiled on first use,
sglang#7339, is warned about and warmed up before ready); one non-streaming chat completion;
greedy answers to fixed prompts (fact `greedy`: with speculation and a `greedy_reference`
recorded without it they must be the target's own, since verification keeps only the target's
argmax); and - with `min_accept_length` - measures the
accept length the way the installed release reports it (see `accept.py`): per request where it
can (0.5.19+: chat `return_spec_tokens_details`; every release: /generate meta_info), else by
sending enough decode work for the decode log to publish it in /server_info (it appears only
after --decode-log-interval decode batches), else from /metrics. A speculator that is silently
off (EAGLE with an EAGLE-3 drafter, the target drafting for itself, a wrong drafter) fails the
deploy; a working one is never failed for "not reported" before that much work was sent.

With `follower: true` (a node rank >= 1 of a multi-node server, which serves only a dummy
/health: orchestrator/sglang/multinode.py) it waits for that /health and checks nothing else.

check: converged when /health is 200, the running server instance is the one this stage last
verified (STATE_DIR/ready.json names its pid, start time and measured accept length, so a
restarted server is verified again), /model_info matches and (with min_accept_length) the
server's cumulative accept length, where it already reports one, is still above the minimum.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import Field

from orchestrator.config.model import Duration
from orchestrator.errors import StageError
from orchestrator.facts.logs import LogTail
from orchestrator.facts.server import ServerStatus
from orchestrator.host import Host
from orchestrator.sglang import accept as spec
from orchestrator.sglang import timeline
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext
from orchestrator.stages.sglang_server.change import indent
from orchestrator.stages.sglang_server.layout import ServerLayout
from orchestrator.stages.sglang_server.reads import read_config
from orchestrator.stages.wait_ready import proof, rules
from orchestrator.stages.wait_ready.api import ServerApi
from orchestrator.stages.wait_ready.rules import ReadyMarker


class WaitReadyParams(Params):
    """Parameters of the wait_ready kind."""

    url: str = Field(description="base URL of the server as seen on the host")
    api_key: str | None = Field(None, description="SECRET: sent as Authorization: Bearer")
    timeout: Duration = Field(1800.0, description="give up after this long (default 30m)")
    poll_interval: Duration = Field(2.0, description="seconds between polls")
    state_dir: str | None = Field(None, description="sglang_server's state_dir (pid + log)")
    expect_architectures: list[str] = Field(default_factory=list)
    chat_model: str | None = Field(None, description="model name for the chat request; "
                                   "default: the first id of /v1/models")
    min_accept_length: float | None = Field(None, ge=0)
    accept_requests: int = Field(4, ge=1, le=64, description="requests whose per-request "
                                 "accept length is measured (where the release reports it)")
    smoke_prompt: str = "In one short sentence: what is the capital of France?"
    smoke_max_tokens: int = Field(32, ge=1)
    request_timeout: Duration = Field(120.0, description="limit for one chat request")
    follower: bool = Field(False, description="a node rank >= 1 of a multi-node server: only "
                           "its dummy /health (always 200 once its schedulers run) is waited "
                           "for; the API is proven on node 0")
    first_token_timeout: Duration = Field(
        25.0, description="a one-token request must answer within this long once /health is "
        "200, else the scheduler is dead or hung behind a healthy /health (sglang#6624)")
    first_token_stall: Duration = Field(
        5.0, description="a first request slower than this is a stall (kernels compiled on "
        "first use, sglang#7339): named in a warning and warmed up before ready is declared")
    greedy_prompts: list[str] = Field(default_factory=lambda: list(rules.GREEDY_PROMPTS),
                                      description="answered greedily at ready (fact `greedy`)")
    greedy_max_tokens: int = Field(24, ge=1, le=256)
    greedy_reference: dict[str, str] | None = Field(
        None, description="prompt -> the answer the target gave WITHOUT speculation (written "
        "by `orchestrator pin` and `tune`): a speculative server must give the same")


class WaitReady(Stage, kind="wait_ready"):
    """Wait until SGLang answers, then verify architectures, a chat reply and the accept length."""

    speculative_check = True

    Params = WaitReadyParams
    params: WaitReadyParams

    def _api(self, host: Host) -> ServerApi:
        p = self.params
        return ServerApi(host, p.url.rstrip("/"), p.api_key, p.request_timeout)

    def _layout(self) -> ServerLayout | None:
        return ServerLayout(self.params.state_dir) if self.params.state_dir else None

    def _server_state(self, host: Host) -> ServerStatus | None:
        layout = self._layout()
        if layout is None:
            return None
        return host.fact(ServerStatus, state_dir=layout.state_dir, log_lines=1)

    def _log_tail(self, host: Host, n: int = 50) -> tuple[str, tuple[str, ...]]:
        layout = self._layout()
        if layout is None:
            return "", ()
        return layout.log, host.fact(LogTail, path=layout.log, lines=n).lines

    def _marker(self, host: Host) -> ReadyMarker | None:
        layout = self._layout()
        try:
            return ReadyMarker.parse(host.read_json(layout.ready)) if layout else None
        except ValueError:
            return None

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        """Converged when this server instance was verified and still matches."""
        p = self.params
        api = self._api(host)
        health = api.health()
        if not health.ok:
            return Needed(f"{api.base}/health: {health.error or health.status}")
        if p.follower:
            return Converged("node rank >= 1: its dummy /health answers 200")
        marker = None
        if p.state_dir:
            st = self._server_state(host)
            pf = st.pidfile if st else None
            marker = self._marker(host)
            if marker is None or not marker.names(pf):
                return Needed(f"the running server (pid {pf.pid if pf else None}) has not been "
                              "verified yet (architectures, a chat reply, the accept length)")
        if p.expect_architectures:
            r = api.get("/model_info")
            if r.status != 200:
                return Needed(f"/model_info answered {r.status or r.error}")
            try:
                problem = rules.arch_problem(p.expect_architectures, r.json())
            except ValueError:
                return Needed("/model_info did not answer JSON")
            if problem:
                return Needed(problem)
        if p.min_accept_length is not None:
            live = spec.from_server_info(api.get("/server_info").json_if_ok())
            ok, reason = rules.accept_verdict(live, marker.accept_length if marker else None,
                                              p.min_accept_length)
            return Converged(reason) if ok else Needed(reason)
        return Converged("ready (/health 200, model_info matches)")

    def _dead(self, host: Host, st: ServerStatus, elapsed: float, pid: int | None) -> StageError:
        """The server exited before it was ever ready. Reported at once even when its
        supervisor restarts it: a failure during the load (a bad flag, a too-old package, a
        kernel for another GPU) usually repeats, and each retry costs the whole load."""
        deadline = time.monotonic() + 3.0
        while st.exit is None and st.process.supervisor_alive and time.monotonic() < deadline:
            time.sleep(0.05)  # the supervisor is still writing the exit record
            st = self._server_state(host) or st
        path, lines = self._log_tail(host)
        text = "\n".join(lines) or "(the log is empty)"
        then = ""
        if st.exit and st.exit.gave_up:
            then = f" (its supervisor gave up: {st.exit.reason})"
        elif st.running or st.restarting:
            then = f" (its supervisor is restarting it: restart {st.restarts})"
        cause = f": {st.last_cause}" if st.last_cause else ""
        return StageError(
            f"the SGLang server (pid {pid or st.process.pid}) {rules.exit_how(st.exit)} "
            f"{elapsed:.0f}s into its start{cause}{then}; last {len(lines)} lines of {path}:\n"
            f"{indent(text)}",
            hint="fix what the log says, then deploy again (sglang_server restarts it; "
            "`orchestrator stop` ends the retries)")

    def _started(self, host: Host) -> ServerStatus | None:
        st0 = self._server_state(host)
        if st0 is not None and st0.pidfile is None:
            raise StageError(f"no server was started from {self.params.state_dir} (no "
                             "server.pid)",
                             hint="run the sglang_server stage first (state_dir must match)")
        return st0

    def _wait(self, host: Host, ctx: StageContext) -> float:
        p = self.params
        api = self._api(host)
        t0 = time.monotonic()
        st0 = self._started(host)
        started_at = st0.started_at if st0 is not None else None
        while True:
            elapsed = time.monotonic() - t0
            # asked on the host every 0.1 s for one poll interval: ready is seen at once
            r = api.health(timeout=max(1.0, min(10.0, p.poll_interval * 5)),
                           until_ok=p.poll_interval)
            if r.ok:
                return time.monotonic() - t0
            st = self._server_state(host)
            if st is not None and st0 is not None and (
                    not st.running or st.restarts > st0.restarts):
                raise self._dead(host, st, elapsed, st0.process.pid if st0.running else None)
            state = rules.health_state(r)
            line = (timeline.current(st.log_tail) or st.log_tail[-1][-160:]) \
                if st is not None and st.log_tail else ""
            since = f", server up {time.time() - started_at:.0f}s" if started_at else ""
            ctx.progress(f"waiting for {api.base}: {state}, {elapsed:.0f}s{since}"
                         + (f" | {line}" if line else ""))
            if elapsed >= p.timeout:
                path, lines = self._log_tail(host)
                text = "\n".join(lines) or "(no log available: set state_dir)"
                raise StageError(
                    f"{api.base} was not ready after {p.timeout:.0f}s ({state}); last "
                    f"lines of {path or 'the server log'}:\n{indent(text)}",
                    hint="raise `timeout` if it is still loading, or fix what the log says")
            ctx.sleep(0.05)  # the probe waited the interval; Ctrl-C ends the wait

    def apply(self, host: Host, ctx: StageContext) -> None:
        """Wait for /health, then verify the model, a chat reply and the accept length."""
        p = self.params
        api = self._api(host)
        waited = self._wait(host, ctx)
        ctx.record("ready_after_s", round(waited, 2))
        if p.follower:  # a dummy health server: no model, no chat (multinode.py)
            return
        st = self._server_state(host)
        pf = st.pidfile if st is not None else None
        if pf is not None and pf.started_at:
            ctx.record("server_up_s", round(time.time() - pf.started_at, 1))
        self._record_timeline(host, ctx, pf.started_at if pf is not None else None)
        model = self._verify_model(api, ctx)
        proof.first_token(api, ctx, p.first_token_timeout, p.first_token_stall,
                          lambda: self._log_tail(host, 20))
        ctx.progress(f"ready after {waited:.0f}s; smoke test: one chat completion")
        ctx.record("smoke_reply", api.chat(model, p.smoke_prompt, p.smoke_max_tokens)[:120])
        server_info = api.json("/server_info", "server info")
        ctx.record("version", server_info.get("version"))
        proof.greedy(api, ctx, p.greedy_prompts, p.greedy_max_tokens, p.greedy_reference,
                     server_info)
        accept = self._accept(host, api, ctx, model, server_info)
        layout = self._layout()
        if layout is not None and pf is not None and pf.pid:
            # what check() compares: this very server instance passed the checks above
            marker = {"pid": pf.pid, "started_at": pf.started_at,
                      "fingerprint": pf.fingerprint, "verified_at": time.time(),
                      "model": model, "version": server_info.get("version"),
                      "accept_length": accept}
            host.write_file(layout.ready, json.dumps(marker, indent=1) + "\n", mode=0o644)

    def _record_timeline(self, host: Host, ctx: StageContext, started_at: float | None) -> None:
        """The load's phases from the server's own log (orchestrator.sglang.timeline), as the
        fact "load_timeline" (epoch start/end) and one progress line."""
        _path, lines = self._log_tail(host, n=5000)
        phases = timeline.anchored(timeline.parse(lines), started_at)
        if phases:
            ctx.record("load_timeline", [ph.to_json() for ph in phases])
            ctx.progress("load: " + timeline.summary(phases))

    def _verify_model(self, api: ServerApi, ctx: StageContext) -> str:
        """/model_info's architectures, and the model name to chat with."""
        p = self.params
        info = api.json("/model_info", "model info")
        ctx.record("architectures", info.get("architectures"))
        problem = rules.arch_problem(p.expect_architectures, info)
        if problem:
            raise StageError(problem, hint="point sglang_server's model_path at the checkpoint "
                             "you mean to serve (or fix expect_architectures)")
        model = p.chat_model
        if model is None:
            data = api.json("/v1/models", "model list").get("data") or []
            if not data:
                raise StageError(f"{api.base}/v1/models lists no model")
            model = str(data[0].get("id"))
        ctx.record("model", model)
        return model

    def _accept(self, host: Host, api: ServerApi, ctx: StageContext, model: str,
                server_info: dict[str, Any]) -> float | None:
        """The accept length: measured and required with min_accept_length, else reported."""
        p = self.params
        accept = spec.from_server_info(server_info)
        if p.min_accept_length is None:
            if accept is not None:
                ctx.record("accept_length", accept)
            return accept
        accept, source = api.measure_accept(ctx, model, server_info, p.accept_requests,
                                            p.smoke_max_tokens)
        ctx.record("accept_length_source", source)
        if accept is not None:
            ctx.record("accept_length", round(accept, 3))
        if accept is None or accept <= p.min_accept_length:
            darch: list[str] = []
            if rules.needs_drafter_archs(server_info):
                draft = str(server_info.get("speculative_draft_model_path"))
                cfg = read_config(host, draft)
                darch = [str(a) for a in (cfg or {}).get("architectures") or []]
            raise StageError(rules.accept_message(
                server_info, accept, floor=p.min_accept_length, requests=p.accept_requests,
                drafter_archs=darch))
        return accept
