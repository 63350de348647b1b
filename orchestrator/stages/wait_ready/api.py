"""wait_ready's calls of SGLang's HTTP API, made FROM the host (the agent's `http` probe); the
request and answer shapes are orchestrator.sglang.api's.

`ServerApi(host, base, api_key, request_timeout)` is a short-lived value made per call of a
stage; it keeps nothing between calls. Failures raise StageError with the texts wait_ready
has always shown.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.http import HttpAnswer
from orchestrator.host import Host
from orchestrator.sglang import accept as spec
from orchestrator.sglang import api
from orchestrator.stages.base import StageContext


@dataclass(frozen=True)
class ServerApi:
    """GET/POST against one server's base URL on the host, with its API key."""

    host: Host
    base: str
    api_key: str | None = field(default=None, repr=False)
    request_timeout: float = 120.0

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def health(self, timeout: float = 10.0, until_ok: float = 0.0) -> HttpAnswer:
        """/health (no key: SGLang serves it to anyone); with UNTIL_OK seconds, asked again
        on the host every 0.1 s until it answers 200 or the time is up."""
        if until_ok:
            return self.host.fact(HttpAnswer, url=self.base + "/health", timeout=timeout,
                                  until_ok=until_ok)
        return self.host.fact(HttpAnswer, url=self.base + "/health", timeout=timeout)

    def get(self, path: str, timeout: float = 10.0) -> HttpAnswer:
        """GET base+path with the key."""
        return self.host.fact(HttpAnswer, url=self.base + path, headers=self._headers(),
                              timeout=timeout)

    def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> HttpAnswer:
        """POST a JSON body to base+path with the key."""
        return self.host.fact(HttpAnswer, url=self.base + path, method="POST",
                              headers={**self._headers(), "Content-Type": "application/json"},
                              body=json.dumps(body), timeout=timeout or self.request_timeout)

    def timed_post(self, path: str, body: dict[str, Any],
                   timeout: float) -> tuple[float, HttpAnswer]:
        """post() and the seconds it took (from here: the host's round trip included)."""
        t0 = time.monotonic()
        answer = self.post(path, body, timeout=timeout)
        return time.monotonic() - t0, answer

    def json(self, path: str, what: str) -> Any:
        """The JSON of a 200 answer; 401 and anything else are StageErrors."""
        r = self.get(path)
        if r.status == 401:
            raise StageError(f"{self.base}{path} answers 401 Unauthorized",
                             hint="the server runs with another API key: give wait_ready the "
                             "same api_key as sglang_server")
        if r.status != 200:
            raise StageError(f"{what}: {self.base}{path} answered "
                             f"{r.status or r.error}: {r.body[:300]}")
        try:
            return r.json()
        except ValueError:
            raise StageError(f"{what}: {self.base}{path} did not answer JSON: "
                             f"{r.body[:200]!r}") from None

    def chat(self, model: str, prompt: str, max_tokens: int) -> str:
        """One non-streaming chat completion's text (content, else reasoning)."""
        r = self.post("/v1/chat/completions", api.chat_body(model, prompt, max_tokens))
        if r.status != 200:
            raise StageError(
                f"chat completion on {self.base}/v1/chat/completions (model {model!r}) "
                f"answered {r.status or r.error}: {r.body[:300]}",
                hint="check chat_model (see /v1/models) and the server log")
        try:
            text = api.chat_text(r.json())
        except ValueError:
            raise StageError(f"chat completion answered something that is not a chat reply: "
                             f"{r.body[:300]!r}") from None
        if not text:
            raise StageError(f"the chat completion of {model!r} came back empty",
                             hint="look at the server log; the model produced no text")
        return text

    def spec_request(self, model: str, prompt: str, max_tokens: int, version: str | None,
                     ignore_eos: bool = False) -> spec.Sample | None:
        """One request that reports its own speculation figures where the release can."""
        path, body, parse = api.spec_request(model, prompt, max_tokens, version, ignore_eos)
        r = self.post(path, body)
        if r.status != 200:
            raise StageError(f"{self.base}{path} answered {r.status or r.error} "
                             f"while measuring the accept length: {r.body[:300]}",
                             hint="check the server log")
        try:
            return parse(r.json())
        except ValueError:
            return None

    def measure_accept(self, ctx: StageContext, model: str, info: dict[str, Any],
                       requests: int, max_tokens: int) -> tuple[float | None, str]:
        """The accept length, measured the way this release reports it (orchestrator.sglang.
        accept): per request, else after enough decode work for the decode log, else /metrics.
        """
        version = info.get("version")
        samples = []
        for i in range(requests):
            ctx.progress(f"measuring the accept length: request {i + 1}/{requests}")
            sample = self.spec_request(model, f"Count from 1 to {8 + i}, separated by commas.",
                                       max_tokens, version)
            if sample is not None:
                samples.append(sample)
        measured = spec.combine(samples)
        if measured is not None:
            n = len(samples)
            return measured, f"per request ({n} request{'s' if n != 1 else ''})"
        tokens = spec.decode_work(info)
        ctx.progress(f"measuring the accept length: no per-request figure; one request of "
                     f"{tokens} tokens so that the decode log reports it")
        self.spec_request(model, "Write a long story about a lighthouse.", tokens, None,
                          ignore_eos=True)
        live = spec.from_server_info(self.json("/server_info", "server info"))
        if live is not None:
            return live, "server_info after the decode log"
        r = self.get("/metrics")
        if r.status == 200:
            metric = spec.from_metrics(r.body)
            if metric is not None:
                return metric, "metrics"
        return None, "not reported"
