"""The gateway in front of SGLang replicas: SMG, the Shepherd Model Gateway (PyPI `smg`), its
launch arguments and its HTTP API's shapes. Pure: the `gateway` stage makes the calls
(orchestrator/stages/gateway/api.py) and orchestrator/remote/gateway_launch.py starts it.

Read from the real code of smg 1.13.0: the wheel's Python launcher (cited "wheel smg/...") and
the Rust gateway of the same release's sdist (cited by its path in the sdist):

- Launch: `smg launch ARGS` = `parse_router_args(ARGS)` (argparse over RouterArgs.add_cli_args,
  then RouterArgs.from_cli_args) and `launch_router()` (wheel smg/cli.py:77-83,
  smg/launch_router.py:74-118), which runs `_validate_router_args()` and `Router.from_args()`
  (launch_router.py:47, 58) and `Router.start()`: the Rust side builds its RouterConfig and
  refuses it with RouterConfig::validate() only there (bindings/python/src/lib.rs:1840-1850;
  model_gateway/src/config/validation.rs:283), e.g. `--health-check-interval-secs 0`, which
  argparse takes (validation.rs:1700-1741). So a launch is proven only by starting it: the
  `check` mode of remote/gateway_launch.py starts it on a spare loopback port first.
  `setproctitle("smg::router")` renames the process (launch_router.py:32).
- `--host` (default 0.0.0.0) and `--port` (default 30000) bind it (router_args.py:62-63,
  508-523); `--worker-urls URL...` (router_args.py:524); `--policy` choices (router_args.py:27-37,
  571-574). A metrics listener ALWAYS runs: `--prometheus-port` (default 29000) on
  `--prometheus-host` (default: the unspecified address of --host's family, so 0.0.0.0)
  (router_args.py:1532-1545; bindings/python/src/lib.rs:657-663, 1869-1873). It takes no key
  (model_gateway/src/observability/metrics_server.rs:18-53), so we bind it to loopback always,
  whatever --host is.
- Keys: `--api-key K` guards the serving routes (Authorization: Bearer K) AND is the key the
  gateway sends to workers given by --worker-urls (model_gateway/src/workflow/job_queue.rs:557);
  a worker added by `POST /workers` carries its own `"api_key"` in the body
  (model_gateway/src/worker/service.rs:471-478; crates/protocols/src/worker.rs:710-712, accepted
  on input, never answered). `--control-plane-api-keys 'id:name:role:key'` (role admin|user;
  router_args.py:2277-2289, parsed at 2654-2676 with split(":", 3), so the key may hold ':')
  guards /workers and the admin routes (model_gateway/src/server.rs:1252-1285, 1911-1913;
  crates/auth/src/middleware.rs:238-273: 401 without a Bearer token). Without control-plane keys
  those routes fall back to --api-key (server.rs:1263-1281, 1909); with no key at all they are
  open (server.rs:1266-1268).
- `/health` is liveness: 200 whatever the workers (server.rs:144-159, 1214).
- Workers: `GET /workers` -> {"workers": [{"id", "url", "is_healthy", "status", ...}]}
  (server.rs:846-861; crates/protocols/src/worker.rs:976-998, 1107-1108); status is one of
  pending, ready, not_ready, failed, draining (worker.rs:136-160, snake_case). `POST /workers
  {"url", "api_key"}` queues an add job: 202, 409 when the URL is already being added or listed
  (service.rs:463-500, 244-248); `DELETE /workers/{id}` queues a removal (service.rs:675-700),
  which marks the worker Draining (no new requests) and drops it after the drain settles
  (model_gateway/src/workflow/steps/local/drain_workers.rs). Draining is still the caller's
  proof to make: the replica's own running + queued requests (SGLang's /metrics).
- Health and failover (what a SIGKILLed replica costs): the `gateway` stage's docstring, with
  the settings it chooses from them (SETTING_FLAGS below).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: the release whose code the rules here were read from (and the one the playbook pins)
GATEWAY_VERSION = "1.13.0"
PACKAGE = "smg"
#: router_args.py:27-37 (argparse choices of --policy, router_args.py:571-574)
POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two",
            "least_load", "manual", "consistent_hashing", "prefix_hash")
#: the control-plane key's id and name (any text without ':'), role admin (router_args.py:2283)
CONTROL_ID = "orchestrator"

#: stage param -> smg flag: health checks, retries, breaker, startup polling (router_args.py:
#: 1214 worker-startup-check-interval, 1770-1804 retries, 1806-1837 breaker, 1840-1872 health)
SETTING_FLAGS = {
    "health_check_interval": "--health-check-interval-secs",
    "health_check_timeout": "--health-check-timeout-secs",
    "health_failure_threshold": "--health-failure-threshold",
    "health_success_threshold": "--health-success-threshold",
    "retry_max_retries": "--retry-max-retries",
    "retry_max_backoff_ms": "--retry-max-backoff-ms",
    "cb_failure_threshold": "--cb-failure-threshold",
    "cb_success_threshold": "--cb-success-threshold",
    "cb_timeout": "--cb-timeout-duration-secs",
    "cb_window": "--cb-window-duration-secs",
    "startup_check_interval": "--worker-startup-check-interval",
}

#: GET /workers status values (crates/protocols/src/worker.rs:136-160)
READY, DRAINING = "ready", "draining"

#: SGLang's scheduler gauges num_running_reqs, num_queue_reqs (0.5.23 sglang/srt/observability/
#: metrics_collector.py:364-375): one series per label set (tp_rank, ..., and per priority under
#: priority scheduling: 1417-1429), so their sum is zero exactly when every series is; only that
#: zero is relied on. The tokenizer's counter num_requests_total of finished requests, one series
#: per is_streaming value (metrics_collector.py:1940-1944, incremented once per request at :2136)
_SERIES = r"^sglang:(?:{})(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)\s*$"


def gateway_args(*, host: str, port: int, prometheus_port: int, policy: str,
                 settings: dict[str, int], extra_args: Iterable[str] = ()) -> list[str]:
    """`smg launch` arguments WITHOUT the worker URLs and the keys (remote/gateway_launch.py
    appends those: the URLs from the launch JSON, the keys from their 0600 files)."""
    metrics_host = "::1" if ":" in host else "127.0.0.1"  # no key on it: never exposed
    args = ["--host", host, "--port", str(port), "--prometheus-host", metrics_host,
            "--prometheus-port", str(prometheus_port), "--policy", policy]
    for name, flag in SETTING_FLAGS.items():
        if name in settings:
            args += [flag, str(settings[name])]
    return args + list(extra_args)


def control_plane_entry(key: str) -> str:
    """The --control-plane-api-keys value for our admin key (router_args.py:2654-2676)."""
    return f"{CONTROL_ID}:{CONTROL_ID}:admin:{key}"


def norm_url(url: str) -> str:
    """A worker URL compared as the gateway lists it (no trailing slash)."""
    return url.rstrip("/")


def in_flight(metrics_text: str) -> int | None:
    """Running + queued requests from SGLang's /metrics text (None when it has no such gauge)."""
    return _sum("num_running_reqs|num_queue_reqs", metrics_text)


def requests_done(metrics_text: str) -> int | None:
    """Requests a worker has finished, from SGLang's /metrics (None without the counter)."""
    return _sum("num_requests_total", metrics_text)


def _sum(names: str, text: str) -> int | None:
    found = re.findall(_SERIES.format(names), text, re.MULTILINE)
    return int(sum(float(v) for v in found)) if found else None


@dataclass(frozen=True)
class Member:
    """One entry of GET /workers (crates/protocols/src/worker.rs:976-998)."""

    id: str
    url: str
    status: str
    healthy: bool

    @property
    def ready(self) -> bool:
        """Routable: status ready (a gateway that sends no status: is_healthy)."""
        return self.status == READY if self.status else self.healthy


def parse_workers(answer: Any) -> list[Member] | None:
    """The members of a GET /workers answer, or None when it is not such a list."""
    if not isinstance(answer, dict) or not isinstance(answer.get("workers"), list):
        return None
    return [Member(str(w.get("id", "")), norm_url(str(w.get("url", ""))),
                   str(w.get("status") or ""), bool(w.get("is_healthy")))
            for w in answer["workers"] if isinstance(w, dict)]


@dataclass(frozen=True)
class Membership:
    """The gateway's members against the desired worker URLs."""

    missing: tuple[str, ...]
    unknown: tuple[Member, ...]
    not_ready: tuple[Member, ...]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unknown or self.not_ready)

    @property
    def reason(self) -> str:
        """What differs, in words ('' when nothing)."""
        parts = []
        if self.missing:
            parts.append("missing " + ", ".join(self.missing))
        if self.unknown:
            parts.append("not desired " + ", ".join(m.url for m in self.unknown))
        if self.not_ready:
            parts.append("not Ready " + ", ".join(f"{m.url} ({m.status or 'unhealthy'})"
                                                  for m in self.not_ready))
        return "membership differs: " + "; ".join(parts) if parts else ""


def membership(listed: Iterable[Member], desired: Iterable[str]) -> Membership:
    """Missing desired URLs, listed members not desired, desired members not Ready."""
    want = [norm_url(u) for u in desired]
    members = list(listed)
    urls = {m.url for m in members}
    return Membership(tuple(u for u in want if u not in urls),
                      tuple(m for m in members if m.url not in want),
                      tuple(m for m in members if m.url in want and not m.ready))
