"""SGLang's router (PyPI `sglang-router`) as the orchestrator drives it: launch and HTTP API.

Read from the real code of sglang-router 0.3.2 (the wheel's Python launcher, and the Rust router
from the same release's sdist, `pip download --no-binary :all: sglang-router==0.3.2`); paths
below are relative to the wheel's `sglang_router/` or to the sdist's root:

- Launch: `python -m sglang_router.launch_router ARGS` parses ARGS with RouterArgs.add_cli_args
  and starts the Rust router (launch_router.py:63-100, 103-106). `--host` (default 0.0.0.0) and
  `--port` (default 30000) bind it (router_args.py:16-17, 222-234); `--worker-urls URL...` takes
  nargs="*" (router_args.py:236-242); `--policy` is one of random, round_robin, cache_aware,
  power_of_two, manual, default cache_aware (router_args.py:245-251, 28).
- `/health` is the router's liveness: 200 "OK" whatever its workers (src/server.rs:94-96,
  142-144, 603); `/readiness` is 200 only while at least one worker is healthy, else 503
  (src/server.rs:98-140, 602).
- Workers: `GET /workers` lists {"workers": [{id, url, is_healthy, load, ...}], "total", "stats"}
  (src/server.rs:634-639, 430-432; src/core/worker_service.rs:159-172, 262-282;
  src/protocols/worker_spec.rs:119-178). There is no /add_worker or /list_workers route in
  0.3.2: `POST /workers {"url": URL}` queues an add job and answers 202 (worker_service.rs:
  225-259); `DELETE /workers/{id}` (id: a UUID from the list) queues a removal and answers 202
  (worker_service.rs:314-336). Both are asynchronous: the change shows in GET /workers later.
- Adding a worker first needs `GET URL/health` to answer 2xx (retried until
  --worker-startup-timeout-secs; src/core/steps/worker/local/detect_connection.rs:17-36,
  mod.rs:76-106), then reads /server_info and /model_info (discover_metadata.rs:99-170).
- Removing a worker takes it out of the policy and the worker registry at once
  (remove_from_policy_registry.rs:39-50, remove_from_worker_registry.rs:52-60): no new request
  goes to it, but nothing waits for the requests it already serves (the removal workflow has no
  drain step: src/core/steps/worker/local/mod.rs:198-263). Draining is the caller's job: wait for
  the worker's own running and queued requests to reach zero (SGLang's /metrics gauges
  `sglang:num_running_reqs`, `sglang:num_queue_reqs`, served with --enable-metrics).
- The OpenAI routes (/v1/chat/completions, ...) are proxied to a worker picked by the policy
  (src/server.rs:180-189, 551-553).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.http import HttpAnswer
from orchestrator.host import Host

#: the release whose code the rules here were read from (and the one the example pins)
ROUTER_VERSION = "0.3.2"
LAUNCH_MODULE = "sglang_router.launch_router"
#: router_args.py:249
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
#: router_args.py:16-17
DEFAULT_HOST, DEFAULT_PORT = "0.0.0.0", 30000

#: SGLang's scheduler gauges (0.5.23 sglang/srt/observability/metrics_collector.py:364-375): one
#: series per label set (tp_rank, ..., and per priority under priority scheduling: 1417-1429),
#: so their sum is zero exactly when every series is; only that zero is relied on
_GAUGE = re.compile(r"^sglang:(num_running_reqs|num_queue_reqs)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$",
                    re.MULTILINE)
#: the tokenizer's counter of finished requests, one series per is_streaming value (0.5.23
#: metrics_collector.py:1940-1944, incremented once per request at :2136)
_REQUESTS = re.compile(r"^sglang:(num_requests_total)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$",
                       re.MULTILINE)


def router_args(worker_urls: Iterable[str], *, policy: str, host: str, port: int,
                extra_args: Iterable[str] = ()) -> list[str]:
    """The launcher's arguments (after `python -m sglang_router.launch_router`)."""
    urls = list(worker_urls)
    args = ["--host", host, "--port", str(port), "--policy", policy]
    if urls:
        args += ["--worker-urls", *urls]
    return args + list(extra_args)


def norm_url(url: str) -> str:
    """A worker URL compared as the router lists it (no trailing slash)."""
    return url.rstrip("/")


def in_flight(metrics_text: str) -> int | None:
    """Running + queued requests from SGLang's /metrics text (None when it has no such gauge)."""
    return _sum(_GAUGE, metrics_text)


def requests_done(metrics_text: str) -> int | None:
    """Requests a worker has finished, from SGLang's /metrics (None without the counter)."""
    return _sum(_REQUESTS, metrics_text)


def _sum(pattern: re.Pattern[str], text: str) -> int | None:
    found = pattern.findall(text)
    if not found:
        return None
    return int(sum(float(v) for _, v in found))


@dataclass(frozen=True)
class Worker:
    """One entry of GET /workers (worker_spec.rs:119-178)."""

    id: str
    url: str
    healthy: bool
    load: int


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
        r = self.get("/workers")
        data = r.json_if_ok()
        if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
            return None
        return [Worker(str(w.get("id", "")), norm_url(str(w.get("url", ""))),
                       bool(w.get("is_healthy")), int(w.get("load") or 0))
                for w in data["workers"] if isinstance(w, dict)]

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
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                                "max_tokens": max_tokens, "temperature": 0, "stream": False}
        if model:
            body["model"] = model
        return self._send("POST", "/v1/chat/completions", body, timeout=self.timeout)

    def worker_in_flight(self, url: str) -> int | None:
        """A worker's running + queued requests, read from its own /metrics."""
        r = self.host.fact(HttpAnswer, url=norm_url(url) + "/metrics", timeout=5.0)
        return in_flight(r.body) if r.ok else None

    def worker_requests_done(self, url: str) -> int | None:
        """How many requests a worker has finished, read from its own /metrics."""
        r = self.host.fact(HttpAnswer, url=norm_url(url) + "/metrics", timeout=5.0)
        return requests_done(r.body) if r.ok else None
