"""The router's HTTP API as the `sglang_router` stage and `deploy --rolling` call it, FROM the
router's host (the agent's `http` probe); routes and answer shapes are orchestrator/sglang/
router.py's (read from sglang-router 0.3.2, cited there)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.http import HttpAnswer
from orchestrator.host import Host
from orchestrator.sglang.api import chat_body
from orchestrator.sglang.router import Worker, in_flight, norm_url, parse_workers, requests_done


@dataclass(frozen=True)
class RouterApi:
    """The router's HTTP API as seen FROM its host (the agent's `http` probe)."""

    host: Host
    base: str
    timeout: float = 30.0

    def get(self, path: str, timeout: float = 10.0) -> HttpAnswer:
        """GET base+path."""
        return self.host.fact(HttpAnswer, url=self.base + path, timeout=timeout)

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout: float | None = None) -> HttpAnswer:
        return self.host.fact(HttpAnswer, url=self.base + path, method=method,
                              headers={"Content-Type": "application/json",
                                       "Accept": "application/json"},
                              body=json.dumps(body) if body is not None else None,
                              timeout=timeout or self.timeout)

    def health(self) -> HttpAnswer:
        """/health: the router process answers (server.rs:142-144)."""
        return self.get("/health", timeout=5.0)

    def workers(self) -> list[Worker] | None:
        """GET /workers, or None when the router does not answer it."""
        return parse_workers(self.get("/workers").json_if_ok())

    def add(self, url: str) -> None:
        """POST /workers {"url": URL}: queued (202) (worker_service.rs:225-259)."""
        r = self._send("POST", "/workers", {"url": url})
        if r.status not in (200, 201, 202):
            raise StageError(f"the router at {self.base} refused to add worker {url}: "
                             f"{r.what} {r.body[:200]}")

    def remove(self, url: str) -> bool:
        """DELETE /workers/{id} of URL (queued, 202); False when the router does not list it."""
        listed = self.workers() or []
        ids = [w.id for w in listed if w.url == norm_url(url)]
        if not ids:
            return False
        for wid in ids:
            r = self._send("DELETE", f"/workers/{wid}")
            if r.status not in (200, 202, 404):
                raise StageError(f"the router at {self.base} refused to remove worker {url} "
                                 f"(id {wid}): {r.what} {r.body[:200]}")
        return True

    def chat(self, model: str | None, prompt: str = "Say OK.", max_tokens: int = 8) -> HttpAnswer:
        """One non-streaming chat completion through the router."""
        return self._send("POST", "/v1/chat/completions", chat_body(model, prompt, max_tokens),
                          timeout=self.timeout)

    def worker_in_flight(self, url: str) -> int | None:
        """A worker's running + queued requests, read from its own /metrics."""
        r = self.host.fact(HttpAnswer, url=norm_url(url) + "/metrics", timeout=5.0)
        return in_flight(r.body) if r.ok else None

    def worker_requests_done(self, url: str) -> int | None:
        """How many requests a worker has finished, read from its own /metrics."""
        r = self.host.fact(HttpAnswer, url=norm_url(url) + "/metrics", timeout=5.0)
        return requests_done(r.body) if r.ok else None
