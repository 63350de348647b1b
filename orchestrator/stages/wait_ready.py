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
architectures, one non-streaming chat completion, and - with `min_accept_length` - measures the
accept length the way the installed release reports it (see `accept.py`): per request where it
can (0.5.19+: chat `return_spec_tokens_details`; every release: /generate meta_info), else by
sending enough decode work for the decode log to publish it in /server_info (it appears only
after --decode-log-interval decode batches), else from /metrics. A speculator that is silently
off (EAGLE with an EAGLE-3 drafter, the target drafting for itself, a wrong drafter) fails the
deploy; a working one is never failed for "not reported" before that much work was sent.

check: converged when /health is 200, the running server instance is the one this stage last
verified (STATE_DIR/ready.json names its pid, start time and measured accept length, so a
restarted server is verified again), /model_info matches and (with min_accept_length) the
server's cumulative accept length, where it already reports one, is still above the minimum.
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
from orchestrator.sglang import accept as spec
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
    accept_requests: int = Field(4, ge=1, le=64, description="requests whose per-request "
                                 "accept length is measured (where the release reports it)")
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

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        p = self.params
        health = host.probe("http", url=self._base + "/health", timeout=10)
        if health.get("status") != 200:
            return Needed(f"{self._base}/health: {health.get('error') or health.get('status')}")
        marker = None
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
            return self._check_accept(host, marker)
        return Converged("ready (/health 200, model_info matches)")

    def _check_accept(self, host: Host, marker: dict[str, Any] | None) -> CheckResult:
        """The accept length this instance was verified with, unless the server's own
        cumulative figure (where it already reports one) has fallen to the minimum."""
        floor = self.params.min_accept_length
        r = self._get(host, "/server_info")
        try:
            live = spec.from_server_info(json.loads(r["body"])) if r.get("status") == 200 \
                else None
        except ValueError:
            live = None
        verified = (marker or {}).get("accept_length")
        value = live if live is not None else verified
        if not isinstance(value, (int, float)):
            return Needed("accept length not measured yet")
        if value <= floor:
            return Needed(f"accept length {value:.2f} is not above {floor}")
        return Converged(f"ready; accept length {value:.2f} > {floor}")

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
        accept = spec.from_server_info(server_info)
        if p.min_accept_length is not None:
            accept, source = self._measure_accept(host, ctx, model, server_info)
            ctx.record("accept_length_source", source)
            if accept is not None:
                ctx.record("accept_length", round(accept, 3))
            if accept is None or accept <= p.min_accept_length:
                raise StageError(self._accept_message(host, server_info, accept))
        elif accept is not None:
            ctx.record("accept_length", accept)
        pf = (st or {}).get("pidfile") or {}
        if p.state_dir and pf.get("pid"):
            # what check() compares: this very server instance passed the checks above
            marker = {"pid": pf.get("pid"), "started_at": pf.get("started_at"),
                      "fingerprint": pf.get("fingerprint"), "verified_at": time.time(),
                      "model": model, "version": server_info.get("version"),
                      "accept_length": accept}
            host.write_file(self._marker_path, json.dumps(marker, indent=1) + "\n", mode=0o644)

    def _measure_accept(self, host: Host, ctx: StageContext, model: str,
                        info: dict[str, Any]) -> tuple[float | None, str]:
        """The accept length, measured the way this release reports it (orchestrator.sglang.
        accept): per request, else after enough decode work for the decode log, else /metrics.
        """
        p = self.params
        version = info.get("version")
        samples = []
        for i in range(p.accept_requests):
            ctx.progress(f"measuring the accept length: request {i + 1}/{p.accept_requests}")
            sample = self._spec_request(host, model, f"Count from 1 to {8 + i}, separated by "
                                        "commas.", p.smoke_max_tokens, version)
            if sample is not None:
                samples.append(sample)
        measured = spec.combine(samples)
        if measured is not None:
            n = len(samples)
            return measured, f"per request ({n} request{'s' if n != 1 else ''})"
        tokens = spec.decode_work(info)
        ctx.progress(f"measuring the accept length: no per-request figure; one request of "
                     f"{tokens} tokens so that the decode log reports it")
        self._spec_request(host, model, "Write a long story about a lighthouse.", tokens, None,
                           ignore_eos=True)
        live = spec.from_server_info(self._json(host, "/server_info", "server info"))
        if live is not None:
            return live, "server_info after the decode log"
        r = self._get(host, "/metrics")
        if r.get("status") == 200:
            metric = spec.from_metrics(r.get("body", ""))
            if metric is not None:
                return metric, "metrics"
        return None, "not reported"

    def _spec_request(self, host: Host, model: str, prompt: str, max_tokens: int,
                      version: str | None, ignore_eos: bool = False) -> spec.Sample | None:
        """One request that reports its own speculation figures where the release can."""
        if spec.per_request_chat(version):
            body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0, "stream": False,
                    "return_spec_tokens_details": True}
            path, parse = "/v1/chat/completions", spec.from_chat
        else:
            body = {"text": prompt, "sampling_params": {
                "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos}}
            path, parse = "/generate", spec.from_generate
        r = self._post(host, path, body)
        if r.get("status") != 200:
            raise StageError(f"{self._base}{path} answered {r.get('status') or r.get('error')} "
                             f"while measuring the accept length: {r.get('body', '')[:300]}",
                             hint="check the server log")
        try:
            return parse(json.loads(r["body"]))
        except ValueError:
            return None

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
                f"{p.min_accept_length} (measured over {p.accept_requests} requests)")
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
