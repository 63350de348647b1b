"""The `wait_ready` stage kind: wait for SGLang to serve, then prove it serves the right thing.

    - id: ready
      uses: wait_ready
      needs: [server]
      with:
        url: "http://{{ sglang_host }}:{{ sglang_port }}"   # as seen ON the host
        api_key: "{{ api_key }}"                           # secret
        timeout: 30m
        poll_interval: 2s
        state_dir: "{{ base_dir }}/run"                    # sglang_server's: pid + log
        expect_architectures: [KimiK25ForConditionalGeneration]
        min_accept_length: 1.2                             # speculation must really work

Polls FROM THE HOST through the agent's `http` probe: connection refused (weights loading) or 503
(warming up) mean "still starting"; the console shows the elapsed time and the server's latest
log line at every poll. If the server PROCESS is gone it fails at once with the last 50 log
lines, never waiting out the timeout. Once /health answers 200 it checks /model_info
architectures, one non-streaming chat completion, and - with `min_accept_length` - sends a few
short chat requests and reads `/server_info` internal_states[0].avg_spec_accept_length: a
speculator that is silently off (EAGLE with an EAGLE-3 drafter, the target drafting for itself,
a wrong drafter) fails the deploy.

check: converged when /health is 200, the running server instance is the one this stage last
verified (STATE_DIR/ready.json names its pid and start time, so a restarted server is verified
again), /model_info matches and (with min_accept_length) the current accept length is above the
minimum - a few requests, well under a second.
Records: ready_after_s, accept_length, model, version, architectures.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import Field, field_validator

from orchestrator.config.model import parse_duration
from orchestrator.errors import StageError
from orchestrator.host import Host
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext


class WaitReadyParams(Params):
    """Parameters of the wait_ready kind."""

    url: str = Field(description="base URL of the server as seen on the host")
    api_key: str | None = Field(None, description="SECRET: sent as Authorization: Bearer")
    timeout: float = Field(1800.0, description="give up after this long (default 30m)")
    poll_interval: float = Field(2.0, description="seconds between polls")
    state_dir: str | None = Field(None, description="sglang_server's state_dir (pid + log)")
    expect_architectures: list[str] = Field(default_factory=list)
    chat_model: str | None = Field(None, description="model name for the chat request; "
                                   "default: the first id of /v1/models")
    min_accept_length: float | None = Field(None, ge=0)
    accept_requests: int = Field(4, ge=1, le=64, description="chat requests sent before "
                                 "reading the accept length")
    smoke_prompt: str = "In one short sentence: what is the capital of France?"
    smoke_max_tokens: int = Field(32, ge=1)
    request_timeout: float = Field(120.0, description="limit for one chat request")

    @field_validator("timeout", "poll_interval", "request_timeout", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


class WaitReady(Stage, kind="wait_ready"):
    """Wait until SGLang answers, then verify architectures, a chat reply and the accept length."""

    Params = WaitReadyParams
    params: WaitReadyParams

    # ------------------------------------------------------------------ http helpers
    @property
    def _base(self) -> str:
        return self.params.url.rstrip("/")

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.params.api_key:
            h["Authorization"] = f"Bearer {self.params.api_key}"
        return h

    def _get(self, host: Host, path: str, timeout: float = 10.0) -> dict[str, Any]:
        return host.probe("http", url=self._base + path, headers=self._headers(),
                          timeout=timeout)

    def _post(self, host: Host, path: str, body: dict[str, Any],
              timeout: float | None = None) -> dict[str, Any]:
        return host.probe("http", url=self._base + path, method="POST",
                          headers={**self._headers(), "Content-Type": "application/json"},
                          body=json.dumps(body), timeout=timeout or self.params.request_timeout)

    def _json(self, host: Host, path: str, what: str) -> Any:
        r = self._get(host, path)
        if r.get("status") == 401:
            raise StageError(f"{self._base}{path} answers 401 Unauthorized",
                             hint="the server runs with another API key: give wait_ready the "
                             "same api_key as sglang_server")
        if r.get("status") != 200:
            raise StageError(f"{what}: {self._base}{path} answered "
                             f"{r.get('status') or r.get('error')}: {r.get('body', '')[:300]}")
        try:
            return json.loads(r["body"])
        except ValueError:
            raise StageError(f"{what}: {self._base}{path} did not answer JSON: "
                             f"{r['body'][:200]!r}") from None

    # ------------------------------------------------------------------ checks
    def _arch_problem(self, info: dict[str, Any]) -> str | None:
        want = self.params.expect_architectures
        got = list(info.get("architectures") or [])
        missing = [a for a in want if a not in got]
        if missing:
            return (f"the server serves architectures {got} from {info.get('model_path')}, "
                    f"expected {want}")
        return None

    @staticmethod
    def _accept_length(server_info: dict[str, Any]) -> float | None:
        states = server_info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            value = states[0].get("avg_spec_accept_length")
            if isinstance(value, (int, float)):
                return float(value)
        value = server_info.get("avg_spec_accept_length")
        return float(value) if isinstance(value, (int, float)) else None

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        p = self.params
        health = host.probe("http", url=self._base + "/health", timeout=10)
        if health.get("status") != 200:
            return Needed(f"{self._base}/health: {health.get('error') or health.get('status')}")
        if p.state_dir:
            st = self._server_state(host) or {}
            pf = st.get("pidfile") or {}
            try:
                marker = host.read_json(self._marker_path)
            except ValueError:
                marker = None
            if not isinstance(marker, dict) or (marker.get("pid"), marker.get("started_at")) != (
                    pf.get("pid"), pf.get("started_at")):
                return Needed(f"the running server (pid {pf.get('pid')}) has not been verified "
                              "yet (architectures, a chat reply, the accept length)")
        if p.expect_architectures:
            r = self._get(host, "/model_info")
            if r.get("status") != 200:
                return Needed(f"/model_info answered {r.get('status') or r.get('error')}")
            try:
                problem = self._arch_problem(json.loads(r["body"]))
            except ValueError:
                return Needed("/model_info did not answer JSON")
            if problem:
                return Needed(problem)
        if p.min_accept_length is not None:
            r = self._get(host, "/server_info")
            try:
                info = json.loads(r["body"]) if r.get("status") == 200 else {}
            except ValueError:
                info = {}
            accept = self._accept_length(info)
            if accept is None:
                return Needed("accept length not measured yet")
            if accept <= p.min_accept_length:
                return Needed(f"accept length {accept:.2f} is not above {p.min_accept_length}")
            return Converged(f"ready; accept length {accept:.2f} > {p.min_accept_length}")
        return Converged("ready (/health 200, model_info matches)")

    # ------------------------------------------------------------------ waiting
    @property
    def _marker_path(self) -> str:
        return f"{str(self.params.state_dir).rstrip('/')}/ready.json"

    def _server_state(self, host: Host) -> dict[str, Any] | None:
        if not self.params.state_dir:
            return None
        return host.probe("server_status", state_dir=self.params.state_dir, log_lines=1)

    def _log_tail(self, host: Host, n: int = 50) -> tuple[str, list[str]]:
        if not self.params.state_dir:
            return "", []
        path = f"{self.params.state_dir.rstrip('/')}/server.log"
        return path, host.probe("log_tail", path=path, lines=n).get("lines") or []

    def _dead(self, host: Host, st: dict[str, Any], elapsed: float) -> StageError:
        deadline = time.monotonic() + 3.0
        while not st.get("exit") and st["process"].get("supervisor_alive") and \
                time.monotonic() < deadline:
            time.sleep(0.05)  # the supervisor is still writing the exit record
            st = self._server_state(host) or st
        exit_rec = st.get("exit") or {}
        if exit_rec.get("code") is not None:
            how = f"exited with code {exit_rec['code']}"
        elif exit_rec.get("signal"):
            how = f"was killed by signal {exit_rec['signal']}"
        else:
            how = "is gone"
        path, lines = self._log_tail(host)
        text = "\n".join(lines) or "(the log is empty)"
        return StageError(
            f"the SGLang server (pid {st['process'].get('pid')}) {how} {elapsed:.0f}s into its "
            f"start; last {len(lines)} lines of {path}:\n{_indent(text)}",
            hint="fix what the log says, then deploy again (sglang_server restarts it)")

    def _wait(self, host: Host, ctx: StageContext) -> float:
        p = self.params
        t0 = time.monotonic()
        st0 = self._server_state(host)
        started_at = None
        if st0 is not None:
            if st0.get("pidfile") is None:
                raise StageError(f"no server was started from {p.state_dir} (no server.pid)",
                                 hint="run the sglang_server stage first (state_dir must match)")
            started_at = (st0.get("pidfile") or {}).get("started_at")
        last_state = ""
        while True:
            elapsed = time.monotonic() - t0
            r = host.probe("http", url=self._base + "/health",
                           timeout=max(1.0, min(10.0, p.poll_interval * 5)))
            if r.get("status") == 200:
                break
            st = self._server_state(host)
            if st is not None and not st["process"]["same_process"]:
                raise self._dead(host, st, elapsed)
            if r.get("error") == "connection refused":
                last_state = "loading (port closed)"
            elif r.get("status") == 503:
                last_state = "warming up (/health 503)"
            else:
                last_state = f"/health: {r.get('error') or r.get('status')}"
            line = ""
            if st is not None and st.get("log_tail"):
                line = st["log_tail"][-1][-160:]
            since = ""
            if started_at:
                since = f", server up {time.time() - float(started_at):.0f}s"
            ctx.progress(f"waiting for {self._base}: {last_state}, {elapsed:.0f}s{since}"
                         + (f" | {line}" if line else ""))
            if elapsed >= p.timeout:
                path, lines = self._log_tail(host)
                text = "\n".join(lines) or "(no log available: set state_dir)"
                raise StageError(
                    f"{self._base} was not ready after {p.timeout:.0f}s ({last_state}); last "
                    f"lines of {path or 'the server log'}:\n{_indent(text)}",
                    hint="raise `timeout` if it is still loading, or fix what the log says")
            ctx.sleep(p.poll_interval)  # Ctrl-C ends the wait (a real load takes 15+ minutes)
        return time.monotonic() - t0

    # ------------------------------------------------------------------ apply
    def apply(self, host: Host, ctx: StageContext) -> None:
        p = self.params
        waited = self._wait(host, ctx)
        ctx.record("ready_after_s", round(waited, 2))
        st = self._server_state(host)
        if st is not None and (st.get("pidfile") or {}).get("started_at"):
            ctx.record("server_up_s", round(time.time() - st["pidfile"]["started_at"], 1))
        info = self._json(host, "/model_info", "model info")
        ctx.record("architectures", info.get("architectures"))
        problem = self._arch_problem(info)
        if problem:
            raise StageError(problem, hint="point sglang_server's model_path at the checkpoint "
                             "you mean to serve (or fix expect_architectures)")
        model = p.chat_model
        if model is None:
            models = self._json(host, "/v1/models", "model list")
            data = models.get("data") or []
            if not data:
                raise StageError(f"{self._base}/v1/models lists no model")
            model = str(data[0].get("id"))
        ctx.record("model", model)
        ctx.progress(f"ready after {waited:.0f}s; smoke test: one chat completion")
        text = self._chat(host, model, p.smoke_prompt)
        ctx.record("smoke_reply", text[:120])
        server_info = self._json(host, "/server_info", "server info")
        ctx.record("version", server_info.get("version"))
        if p.min_accept_length is not None:
            for i in range(p.accept_requests - 1):
                ctx.progress(f"measuring the accept length: request {i + 2}/{p.accept_requests}")
                self._chat(host, model, f"Count from 1 to {8 + i}, separated by commas.")
            server_info = self._json(host, "/server_info", "server info")
            accept = self._accept_length(server_info)
            ctx.record("accept_length", accept)
            if accept is None or accept <= p.min_accept_length:
                raise StageError(self._accept_message(host, server_info, accept))
        else:
            accept = self._accept_length(server_info)
            if accept is not None:
                ctx.record("accept_length", accept)
        pf = (st or {}).get("pidfile") or {}
        if p.state_dir and pf.get("pid"):
            # what check() compares: this very server instance passed the checks above
            marker = {"pid": pf.get("pid"), "started_at": pf.get("started_at"),
                      "fingerprint": pf.get("fingerprint"), "verified_at": time.time(),
                      "model": model, "version": server_info.get("version"),
                      "accept_length": accept}
            host.write_file(self._marker_path, json.dumps(marker, indent=1) + "\n", mode=0o644)

    def _chat(self, host: Host, model: str, prompt: str) -> str:
        p = self.params
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": p.smoke_max_tokens, "temperature": 0, "stream": False}
        r = self._post(host, "/v1/chat/completions", body)
        if r.get("status") != 200:
            raise StageError(
                f"chat completion on {self._base}/v1/chat/completions (model {model!r}) "
                f"answered {r.get('status') or r.get('error')}: {r.get('body', '')[:300]}",
                hint="check chat_model (see /v1/models) and the server log")
        try:
            msg = json.loads(r["body"])["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise StageError(f"chat completion answered something that is not a chat reply: "
                             f"{r.get('body', '')[:300]!r}") from None
        text = (msg.get("content") or msg.get("reasoning_content") or "").strip()
        if not text:
            raise StageError(f"the chat completion of {model!r} came back empty",
                             hint="look at the server log; the model produced no text")
        return text

    def _accept_message(self, host: Host, info: dict[str, Any], accept: float | None) -> str:
        p = self.params
        algo = info.get("speculative_algorithm")
        draft = info.get("speculative_draft_model_path")
        got = "not reported" if accept is None else f"{accept:.2f}"
        head = (f"speculative decoding does not pay off: accept length {got}, required > "
                f"{p.min_accept_length} (after {p.accept_requests} requests)")
        if not algo:
            return head + ("; the server runs WITHOUT speculative decoding (no "
                           "speculative_algorithm): set speculative.algorithm: EAGLE3 and "
                           "draft_model_path on sglang_server")
        if draft and draft == info.get("model_path"):
            return head + (f"; the target model is its own draft ({draft}): SGLang filled in the "
                           "missing draft path (sglang issue #36528): set draft_model_path to "
                           "the EAGLE-3 drafter")
        darch: list[str] = []
        if draft:
            try:
                cfg = host.read_json(f"{str(draft).rstrip('/')}/config.json")
            except ValueError:
                cfg = None
            if isinstance(cfg, dict):
                darch = [str(a) for a in cfg.get("architectures") or []]
        if algo == "EAGLE" and any("Eagle3" in a for a in darch):
            return head + (f"; speculative_algorithm is EAGLE but the drafter is an EAGLE-3 "
                           f"model ({', '.join(darch)}): SGLang then silently accepts nothing "
                           "(sglang PR #21272). Set speculative.algorithm: EAGLE3")
        return head + (f"; algorithm {algo}, drafter {draft} ({', '.join(darch) or 'unknown'}): "
                       "the drafter does not match the target (wrong repo or revision?) - use "
                       "the drafter trained for this target")
