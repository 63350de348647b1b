"""The gateway's HTTP API as the `gateway` stage and the fleet schedule call it, FROM the gateway's
host (the agent's `http` probe); routes, keys and answer shapes are orchestrator/sglang/gateway.py's
(read from smg 1.13.0, cited there). /workers calls carry the control-plane key, chats and the
replicas' own routes the api key, both as `Authorization: Bearer`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.http import HttpAnswer
from orchestrator.host import Host
from orchestrator.sglang.api import chat_body
from orchestrator.sglang.gateway import Member, in_flight, norm_url, parse_workers, requests_done


@dataclass(frozen=True)
class GatewayApi:
    """The gateway's HTTP API as seen FROM its host. `control_key` guards /workers (without one
    SMG falls back to the api key: server.rs:1263-1281, so that is sent instead)."""

    host: Host
    base: str
    api_key: str | None = None
    control_key: str | None = None
    timeout: float = 30.0

    def _call(self, url: str, method: str = "GET", key: str | None = None,
              body: dict[str, Any] | None = None, timeout: float | None = None) -> HttpAnswer:
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        return self.host.fact(HttpAnswer, url=url, method=method, headers=headers,
                              body=json.dumps(body) if body is not None else None,
                              timeout=timeout or self.timeout)

    def _admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> HttpAnswer:
        return self._call(self.base + path, method, self.control_key or self.api_key, body,
                          timeout=10.0)

    def health(self) -> HttpAnswer:
        """/health: the gateway process answers (server.rs:144-159)."""
        return self._call(self.base + "/health", timeout=5.0)

    def workers(self) -> list[Member] | None:
        """GET /workers, or None when the gateway does not answer it (or refuses our key)."""
        return parse_workers(self._admin("GET", "/workers").json_if_ok())

    def add(self, url: str) -> None:
        """POST /workers {"url", "api_key"}: queued (202); 409 = already listed or being added
        (worker/service.rs:463-500, 244-248)."""
        body: dict[str, Any] = {"url": norm_url(url)}
        if self.api_key:
            body["api_key"] = self.api_key
        r = self._admin("POST", "/workers", body)
        if r.status not in (200, 201, 202, 409):
            raise StageError(f"the gateway at {self.base} refused to add worker {url}: "
                             f"{r.what} {r.body[:200]}")

    def remove(self, url: str) -> bool:
        """DELETE /workers/{id} of URL (queued, 202: the worker drains, then goes); False when
        the gateway does not list it."""
        ids = [m.id for m in self.workers() or [] if m.url == norm_url(url)]
        for wid in ids:
            r = self._admin("DELETE", f"/workers/{wid}")
            if r.status not in (200, 202, 404):
                raise StageError(f"the gateway at {self.base} refused to remove worker {url} "
                                 f"(id {wid}): {r.what} {r.body[:200]}")
        return bool(ids)

    def chat(self, model: str | None, prompt: str = "Say OK.", max_tokens: int = 8) -> HttpAnswer:
        """One non-streaming chat completion through the gateway (Bearer api key)."""
        return self._call(self.base + "/v1/chat/completions", "POST", self.api_key,
                          chat_body(model, prompt, max_tokens))

    def worker_health(self, url: str) -> HttpAnswer:
        """A replica's OWN /health, asked from the gateway's host (its readiness to be added)."""
        return self._call(norm_url(url) + "/health", key=self.api_key, timeout=5.0)

    def worker_in_flight(self, url: str) -> int | None:
        """A worker's running + queued requests, read from its own /metrics."""
        return self._metric(url, in_flight)

    def worker_requests_done(self, url: str) -> int | None:
        """How many requests a worker has finished, read from its own /metrics."""
        return self._metric(url, requests_done)

    def _metric(self, url: str, read: Callable[[str], int | None]) -> int | None:
        r = self._call(norm_url(url) + "/metrics", key=self.api_key, timeout=5.0)
        return read(r.body) if r.ok else None
