"""SGLang's router (PyPI `sglang-router`): its launch and its HTTP API's shapes (pure: the
`sglang_router` stage makes the calls, orchestrator/stages/sglang_router/api.py).

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

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


def parse_workers(answer: Any) -> list[Worker] | None:
    """The workers of a GET /workers answer (worker_service.rs:262-282), or None when it is not
    such a list."""
    if not isinstance(answer, dict) or not isinstance(answer.get("workers"), list):
        return None
    return [Worker(str(w.get("id", "")), norm_url(str(w.get("url", ""))),
                   bool(w.get("is_healthy")), int(w.get("load") or 0))
            for w in answer["workers"] if isinstance(w, dict)]
