"""Operator commands for the deployed SGLang server: status, logs, stop (used by the CLI).

Which hosts, and where their server lives (the rule):

* hosts: every inventory host (or those `--limit` selects) whose variables give a state dir:
  `sglang_state_dir` if set, else `{{ base_dir }}/run` (what the playbook's sglang_server stage
  uses); `--state-dir DIR` sets it for every selected host. Hosts without one (hypervisors) are
  left out; naming one with `--limit` is an error.
* URL: `http://{{ sglang_host }}:{{ sglang_port }}` (defaults 127.0.0.1 and 30000), polled ON
  the host through the agent, like wait_ready.
* API key (for /server_info): `--var api_key=...`, else the host variable `api_key`, else the
  environment variable SGLANG_API_KEY. It is registered with the redactor, never printed.

Variables are the inventory's (inventory, group and host vars, rendered) plus `--var`; no
playbook is read.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.loader import load_inventory
from orchestrator.config.model import HostSpec, Inventory, Playbook, StageSpec
from orchestrator.config.variables import host_variables
from orchestrator.errors import ConfigError, OrchestratorError, StageError
from orchestrator.plan import Selection, build_plan
from orchestrator.redact import REDACTOR
from orchestrator.transports import make_transport
from orchestrator.transports.base import Transport

TransportFactory = Callable[[HostSpec], Transport]


@dataclass
class ServiceTarget:
    """One host's server: where its state lives and how to reach its API on the host."""

    name: str
    spec: HostSpec
    state_dir: str
    api_host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        host = self.api_host if self.api_host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    @property
    def log_path(self) -> str:
        return f"{self.state_dir.rstrip('/')}/server.log"


def _empty_playbook() -> Playbook:
    return Playbook(name="service", stages=[StageSpec(id="noop", run="true")])


def resolve_targets(
    inventory: Inventory | str,
    *,
    limit: list[str] | None = None,
    cli_vars: dict[str, Any] | None = None,
    state_dir: str | None = None,
    environ: dict[str, str] | None = None,
) -> list[ServiceTarget]:
    """The hosts to act on, with their state dir, API address and key (see the module rule)."""
    inv = load_inventory(inventory) if isinstance(inventory, str) else inventory
    env = os.environ if environ is None else environ
    pb = _empty_playbook()
    plan = build_plan(pb, inv, Selection.from_args(limit))
    explicit = bool(limit)
    targets: list[ServiceTarget] = []
    missing: list[str] = []
    for name in plan.hosts:
        variables = host_variables(pb, inv, name, cli_vars or {})
        sdir = state_dir or variables.get("sglang_state_dir")
        if not sdir and variables.get("base_dir"):
            sdir = f"{str(variables['base_dir']).rstrip('/')}/run"
        if not sdir:
            missing.append(name)
            continue
        key = variables.get("api_key") or env.get("SGLANG_API_KEY") or None
        if key:
            REDACTOR.add(str(key))
        try:
            port = int(variables.get("sglang_port") or 30000)
        except (TypeError, ValueError):
            raise ConfigError(f"host {name}: sglang_port {variables.get('sglang_port')!r} is "
                              "not a port number") from None
        targets.append(ServiceTarget(
            name=name, spec=inv.hosts[name], state_dir=str(sdir),
            api_host=str(variables.get("sglang_host") or "127.0.0.1"), port=port,
            api_key=str(key) if key else None,
        ))
    if explicit and missing:
        raise ConfigError(
            f"no state dir for {', '.join(missing)}: set the host variable base_dir (the "
            "server's files are in BASE_DIR/run) or sglang_state_dir, or pass --state-dir")
    if not targets:
        raise ConfigError(
            "no host of the inventory has a state dir (host variable base_dir or "
            "sglang_state_dir); pass --state-dir DIR")
    return targets


def _connect(target: ServiceTarget, factory: TransportFactory | None,
             budget: float) -> Transport:
    t = (factory or make_transport)(target.spec)
    t.connect(budget=budget)
    return t


def _json_body(res: dict[str, Any]) -> Any:
    if res.get("status") != 200:
        return None
    try:
        return json.loads(res.get("body") or "")
    except ValueError:
        return None


def host_status(target: ServiceTarget, transport: Transport) -> dict[str, Any]:
    """The state of one host's server: running/stopped/dead, pid, uptime, model, readiness."""
    st = transport.probe("server_status", state_dir=target.state_dir, host=target.api_host,
                         port=target.port)
    proc = st["process"]
    pidfile = st.get("pidfile") or {}
    exit_rec = st.get("exit") or {}
    launch_raw = transport.read_file(f"{target.state_dir.rstrip('/')}/launch.json")
    try:
        launch = json.loads(launch_raw) if launch_raw else {}
    except ValueError:
        launch = {}
    out: dict[str, Any] = {
        "host": target.name, "state_dir": target.state_dir, "url": target.url,
        "pid": proc.get("pid") if proc.get("same_process") else None,
        "uptime_s": proc.get("uptime_s"),
        "model": launch.get("served_model_name") or launch.get("model_path"),
        "speculative_algorithm": launch.get("speculative_algorithm"),
        "managed_by": pidfile.get("managed_by") or launch.get("managed_by"),
        "ready": False, "accept_length": None, "version": None, "detail": None,
    }
    if proc.get("same_process"):
        out["state"] = "running"
    elif not pidfile:
        out["state"] = "stopped"
        out["detail"] = "never started from this state dir"
    elif exit_rec.get("stop_requested") or st.get("stop_requested"):
        out["state"] = "stopped"
        out["detail"] = "stopped on request"
    else:
        out["state"] = "dead"
        if exit_rec.get("code") is not None:
            out["detail"] = f"exited with code {exit_rec['code']}"
        elif exit_rec.get("signal"):
            out["detail"] = f"killed by signal {exit_rec['signal']}"
        else:
            out["detail"] = "process gone (host rebooted or killed)"
    listener = st.get("listener")
    if listener is not None and not listener.get("ours"):
        out["detail"] = (f"port {target.port} held by a process not started by us (pid "
                         f"{listener.get('pid')})")
    health = st.get("health") or {}
    out["ready"] = health.get("status") == 200 and out["state"] == "running"
    if out["state"] == "running" and not out["ready"]:
        out["detail"] = "starting: " + (health.get("error") or f"/health {health.get('status')}"
                                        if health else "port not listening yet")
    if out["ready"]:
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        res = transport.probe("http", url=target.url + "/server_info", headers=headers,
                              timeout=10)
        info = _json_body(res)
        if isinstance(info, dict):
            out["version"] = info.get("version")
            states = info.get("internal_states") or []
            if states and isinstance(states[0], dict):
                out["accept_length"] = states[0].get("avg_spec_accept_length")
            out["speculative_algorithm"] = info.get("speculative_algorithm",
                                                    out["speculative_algorithm"])
        elif res.get("status") == 401:
            out["detail"] = "/server_info needs the API key (--var api_key=... or SGLANG_API_KEY)"
    return out


def _on_each(targets: list[ServiceTarget], fn: Callable[[ServiceTarget, Transport],
                                                         dict[str, Any]],
             factory: TransportFactory | None, budget: float) -> list[dict[str, Any]]:
    """fn(target, its connection) on every target in parallel; a host that fails is reported."""
    def one(target: ServiceTarget) -> dict[str, Any]:
        try:
            t = _connect(target, factory, budget)
            try:
                return fn(target, t)
            finally:
                t.close()
        except OrchestratorError as exc:
            return {"host": target.name, "state": "unreachable" if exc.exit_code == 3 else "error",
                    "error": REDACTOR.redact(exc.render()), "exit_code": exc.exit_code}

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as ex:
        return list(ex.map(one, targets))


def collect_status(targets: list[ServiceTarget], *, factory: TransportFactory | None = None,
                   budget: float = 10.0) -> list[dict[str, Any]]:
    """host_status for every target, in parallel; unreachable hosts are reported, not raised."""
    return _on_each(targets, host_status, factory, budget)


def status_exit_code(rows: list[dict[str, Any]]) -> int:
    """3 if a host was unreachable, 1 if a server is not running and ready, else 0."""
    if any(r.get("state") == "unreachable" for r in rows):
        return 3
    return 0 if all(r.get("state") == "running" and r.get("ready") for r in rows) else 1


def _fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{(s % 86400) // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def render_status(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of status rows."""
    head = ["HOST", "STATE", "PID", "UPTIME", "MODEL", "SPEC", "READY", "ACCEPT", "DETAIL"]
    table = [head]
    for r in rows:
        acc = r.get("accept_length")
        table.append([
            str(r.get("host")), str(r.get("state")), str(r.get("pid") or "-"),
            _fmt_uptime(r.get("uptime_s")), str(r.get("model") or "-"),
            str(r.get("speculative_algorithm") or "-"),
            "yes" if r.get("ready") else "no",
            f"{acc:.2f}" if isinstance(acc, (int, float)) else "-",
            str(r.get("detail") or r.get("error") or ""),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    lines = []
    for row in table:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# ------------------------------------------------------------------------------ logs


def tail_logs(targets: list[ServiceTarget], lines: int = 50, *,
              factory: TransportFactory | None = None, budget: float = 10.0
              ) -> list[dict[str, Any]]:
    """The last `lines` lines of each host's server log: [{"host", "lines"|"error"}]."""
    def one(target: ServiceTarget, t: Transport) -> dict[str, Any]:
        res = t.probe("log_tail", path=target.log_path, lines=lines)
        if not res.get("exists"):
            return {"host": target.name, "lines": [], "missing": target.log_path}
        return {"host": target.name, "lines": res.get("lines") or []}

    return _on_each(targets, one, factory, budget)


def follow_logs(
    targets: list[ServiceTarget],
    write: Callable[[str], None],
    *,
    lines: int = 10,
    interval: float = 1.0,
    stop: threading.Event | None = None,
    factory: TransportFactory | None = None,
    budget: float = 10.0,
) -> None:
    """Print the last `lines` lines, then new lines as they come ("HOST | line"), until `stop`."""
    stop = stop or threading.Event()
    conns: dict[str, Transport] = {}
    pos: dict[str, tuple[int, Any]] = {}
    partial: dict[str, str] = {}
    try:
        for target in targets:
            conns[target.name] = _connect(target, factory, budget)
            t = conns[target.name]
            # one read: the lines shown and where following starts (no line lost in between)
            res = t.probe("log_tail", path=target.log_path, lines=lines, complete=True)
            for line in res.get("lines") or []:
                write(f"{target.name} | {REDACTOR.redact(line)}")
            pos[target.name] = (int(res.get("offset") or 0), res.get("inode"))
        while not stop.is_set():
            for target in targets:
                offset, inode = pos[target.name]
                res = conns[target.name].probe("log_read", path=target.log_path, offset=offset,
                                               inode=inode)
                if res.get("rotated"):
                    write(f"{target.name} | --- log rotated (server restarted) ---")
                    partial[target.name] = ""
                text = partial.get(target.name, "") + (res.get("data") or "")
                *complete, rest = text.split("\n")
                for line in complete:
                    write(f"{target.name} | {REDACTOR.redact(line.rstrip(chr(13)))}")
                partial[target.name] = rest
                pos[target.name] = (int(res.get("offset") or 0), res.get("inode"))
            stop.wait(interval)
    finally:
        for t in conns.values():
            t.close()


# ------------------------------------------------------------------------------ stop


def stop_host(target: ServiceTarget, transport: Transport, grace: float = 60.0) -> dict[str, Any]:
    """Stop one host's server gracefully (systemd unit or process group)."""
    st = transport.probe("server_status", state_dir=target.state_dir)
    pidfile = st.get("pidfile") or {}
    t0 = time.monotonic()
    if pidfile.get("managed_by") == "systemd" and pidfile.get("unit"):
        r = transport.run(shlex.join(["systemctl", "stop", str(pidfile["unit"])]),
                          timeout=grace + 30)
        if not r.ok:
            raise StageError(f"systemctl stop {pidfile['unit']} failed: {r.tail(5)}")
    res = transport.probe("server_stop", state_dir=target.state_dir, grace=grace)
    out = {"host": target.name, "pid": res.get("pid"), "was_running": res.get("was_running"),
           "stopped": bool(res.get("stopped")), "forced": res.get("forced"),
           "seconds": round(time.monotonic() - t0, 2)}
    if res.get("holdouts"):
        out["holdouts"] = res["holdouts"]
    if res.get("error"):
        out["error"] = res["error"]
    return out


def stop_all(targets: list[ServiceTarget], *, grace: float = 60.0,
             factory: TransportFactory | None = None, budget: float = 10.0
             ) -> list[dict[str, Any]]:
    """stop_host on every target, in parallel."""
    return _on_each(targets, lambda target, t: stop_host(target, t, grace), factory, budget)
