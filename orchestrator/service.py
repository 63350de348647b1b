"""Operator commands for the deployed services: status, logs, stop (used by the CLI).

Which service runs where is one table, `SERVICE_KINDS` (a row per kind of long-running service:
the host variables that name its state dir, API and keys; see ServiceKind):

* sglang_server: every inventory host (or those `--limit` selects) with a state dir:
  `sglang_state_dir`, else `{{ base_dir }}/run`, or `--state-dir DIR` for every selected host;
  hosts without one (hypervisors) are left out, naming one with `--limit` is an error. URL
  `http://{{ sglang_host }}:{{ sglang_port }}` (127.0.0.1:30000).
* gateway: hosts of the group `gateway` (or with `gateway_state_dir`): `gateway_state_dir`,
  else `{{ base_dir }}/gateway`; URL `http://{{ gateway_host }}:{{ gateway_port }}`
  (127.0.0.1:30080); status adds its members through the stage's GatewayApi. A gateway host's
  BASE_DIR/run is shown only once a server was started there.
* APIs are polled ON the host through the agent, like wait_ready. The API key: `--var
  api_key=...`, the host variable `api_key`, else $SGLANG_API_KEY; the gateway's control-plane
  key: `--var gateway_admin_key=...`, the host variable, else $ORCHESTRATOR_GATEWAY_ADMIN_KEY.
  Keys are registered with the redactor, never printed.

Every kind runs under the same supervisor (orchestrator/remote/supervisor.py), so state, logs and
stop read the same facts. Variables are the inventory's (rendered) plus `--var`; no playbook.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.config.loader import load_inventory
from orchestrator.config.model import HostSpec, Inventory, Playbook, StageSpec
from orchestrator.config.variables import host_variables
from orchestrator.errors import ConfigError, OrchestratorError, StageError
from orchestrator.facts import to_data
from orchestrator.facts.http import HttpAnswer
from orchestrator.facts.logs import LogChunk, LogTail
from orchestrator.facts.server import ServerStatus, ServerStop
from orchestrator.host import Host
from orchestrator.plan import Selection, build_plan
from orchestrator.redact import REDACTOR
from orchestrator.sglang import timeline
from orchestrator.sglang.api import DEFAULT_HOST, DEFAULT_PORT, chat_body, chat_text, local_url
from orchestrator.stages.gateway.api import GatewayApi
from orchestrator.stages.sglang_server.layout import ServerLayout
from orchestrator.transports import AgentTransport, make_transport

TransportFactory = Callable[[HostSpec], AgentTransport]


@dataclass
class ServiceTarget:
    """One service on one host: its kind, where its state lives, how to reach its API there.
    `optional`: shown only once it was ever started (a gateway host's BASE_DIR/run)."""

    name: str
    spec: HostSpec
    state_dir: str
    api_host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = field(default=None, repr=False)
    kind: str = "sglang_server"
    control_key: str | None = field(default=None, repr=False)
    optional: bool = False

    @property
    def url(self) -> str:
        """The API as seen on the host."""
        return local_url(self.api_host, self.port)

    @property
    def label(self) -> str:
        """How rows and log lines name it: the host, plus the kind unless it is the server."""
        return self.name if self.kind == "sglang_server" else f"{self.name}:{self.kind}"

    @property
    def layout(self) -> ServerLayout:
        """The files of its state dir."""
        return ServerLayout(self.state_dir)


def gateway_members(target: ServiceTarget, host: Host) -> list[dict[str, Any]] | None:
    """The gateway's workers as {id, url, status, healthy} (None: /workers did not answer)."""
    members = GatewayApi(host, target.url, target.api_key, target.control_key).workers()
    return None if members is None else [asdict(m) for m in members]


@dataclass(frozen=True)
class ServiceKind:
    """A row of SERVICE_KINDS: how a host's variables name one kind of service (see the rule)."""

    kind: str
    state_var: str  # host variable naming its state dir
    subdir: str  # else BASE_DIR/<subdir>
    group: str | None  # only hosts of this group (or with state_var); None: every host
    host_var: str
    port_var: str
    default_port: int
    control_key_var: str | None = None
    control_key_env: str | None = None
    members: Callable[[ServiceTarget, Host], list[dict[str, Any]] | None] | None = None

    def state_dir(self, variables: dict[str, Any]) -> str | None:
        """Its state dir on a host with these variables, or None: the host has none."""
        if variables.get(self.state_var):
            return str(variables[self.state_var])
        if self.group is not None and self.group not in (variables.get("group_names") or ()):
            return None
        base = variables.get("base_dir")
        return f"{str(base).rstrip('/')}/{self.subdir}" if base else None


SGLANG_KIND = ServiceKind("sglang_server", "sglang_state_dir", "run", None, "sglang_host",
                          "sglang_port", DEFAULT_PORT)
GATEWAY_KIND = ServiceKind("gateway", "gateway_state_dir", "gateway", "gateway", "gateway_host",
                           "gateway_port", 30080, control_key_var="gateway_admin_key",
                           control_key_env="ORCHESTRATOR_GATEWAY_ADMIN_KEY",
                           members=gateway_members)
SERVICE_KINDS: dict[str, ServiceKind] = {k.kind: k for k in (SGLANG_KIND, GATEWAY_KIND)}


def _secret(variables: dict[str, Any], var: str | None, env: Any, name: str | None) -> str | None:
    key = (variables.get(var) if var else None) or (env.get(name) if name else None) or None
    if key:
        REDACTOR.add(str(key))
    return str(key) if key else None


def _host_targets(name: str, spec: HostSpec, variables: dict[str, Any], env: Any,
                  state_dir: str | None, kinds: dict[str, ServiceKind]) -> list[ServiceTarget]:
    """The services of one host: --state-dir names the SGLang server's for every host."""
    found = []
    for kind in kinds.values():
        sdir = state_dir if state_dir and kind is SGLANG_KIND else kind.state_dir(variables)
        if not sdir:
            continue
        raw_port = variables.get(kind.port_var) or kind.default_port
        try:
            port = int(raw_port)
        except (TypeError, ValueError):
            raise ConfigError(f"host {name}: {kind.port_var} {raw_port!r} is not a port "
                              "number") from None
        found.append(ServiceTarget(
            name=name, spec=spec, state_dir=sdir,
            api_host=str(variables.get(kind.host_var) or DEFAULT_HOST), port=port,
            api_key=_secret(variables, "api_key", env, "SGLANG_API_KEY"), kind=kind.kind,
            control_key=_secret(variables, kind.control_key_var, env, kind.control_key_env)))
    if len(found) > 1 and not state_dir:
        for t in found:  # BASE_DIR/run on a gateway host: only once something ran there
            t.optional = t.kind == "sglang_server" and not variables.get("sglang_state_dir")
    return found


def resolve_targets(
    inventory: Inventory | str,
    *,
    limit: list[str] | None = None,
    cli_vars: dict[str, Any] | None = None,
    state_dir: str | None = None,
    environ: dict[str, str] | None = None,
    kinds: dict[str, ServiceKind] | None = None,
) -> list[ServiceTarget]:
    """The services to act on, with their state dir, API address and keys (the module rule)."""
    inv = load_inventory(inventory) if isinstance(inventory, str) else inventory
    env = os.environ if environ is None else environ
    pb = Playbook(name="service", stages=[StageSpec(id="noop", run="true")])
    plan = build_plan(pb, inv, Selection.from_args(limit))
    targets: list[ServiceTarget] = []
    missing: list[str] = []
    for name in plan.hosts:
        variables = host_variables(pb, inv, name, cli_vars or {})
        found = _host_targets(name, inv.hosts[name], variables, env, state_dir,
                              SERVICE_KINDS if kinds is None else kinds)
        targets.extend(found)
        if not found:
            missing.append(name)
    if limit and missing:
        raise ConfigError(
            f"no state dir for {', '.join(missing)}: set the host variable base_dir (the "
            "server's files are in BASE_DIR/run, a gateway's in BASE_DIR/gateway) or "
            "sglang_state_dir, or pass --state-dir")
    if not targets:
        raise ConfigError(
            "no host of the inventory has a state dir (host variable base_dir or "
            "sglang_state_dir); pass --state-dir DIR")
    return targets


def open_host(target: ServiceTarget, factory: TransportFactory | None, budget: float,
              cancelled: threading.Event | None = None) -> Host:
    """A Host for one target (its actions are refused once `cancelled` is set)."""
    t = (factory or make_transport)(target.spec)
    t.connect(budget=budget)
    return Host(target.spec, t, dict(target.spec.vars), cancelled=cancelled)


def _on_each(targets: list[ServiceTarget], fn: Callable[[ServiceTarget, Host], dict[str, Any]],
             factory: TransportFactory | None, budget: float) -> list[dict[str, Any]]:
    """fn(target, its Host) on every target, one thread per host; a host that fails is
    reported. Ctrl-C cancels: no host starts a command or an action after it."""
    cancelled = threading.Event()

    def one(target: ServiceTarget) -> dict[str, Any]:
        try:
            host = open_host(target, factory, budget, cancelled)
            try:
                return fn(target, host)
            finally:
                host.transport.close()
        except OrchestratorError as exc:
            return {"host": target.label,
                    "state": "unreachable" if exc.exit_code == 3 else "error",
                    "error": REDACTOR.redact(exc.render()), "exit_code": exc.exit_code}

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as ex:
        try:
            return list(ex.map(one, targets))
        except KeyboardInterrupt:
            cancelled.set()
            raise


# ------------------------------------------------------------------------------ status


@dataclass(frozen=True)
class LaunchRecord:
    """What status shows of STATE_DIR/launch.json (written by sglang_server)."""

    model: str | None = None
    speculative_algorithm: str | None = None
    managed_by: str | None = None

    @classmethod
    def read(cls, host: Host, layout: ServerLayout) -> LaunchRecord:
        """The launch spec of the last launch (empty when absent or unreadable)."""
        try:
            raw = host.read_json(layout.launch)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            return cls()
        return cls(model=raw.get("served_model_name") or raw.get("model_path"),
                   speculative_algorithm=raw.get("speculative_algorithm"),
                   managed_by=raw.get("managed_by"))


def _state(st: ServerStatus) -> tuple[str, str | None]:
    """running / restarting / stopped / dead, and why."""
    if st.running:
        return "running", None
    if st.pidfile is None:
        return "stopped", "never started from this state dir"
    rec = st.exit
    if (rec is not None and rec.stop_requested) or st.stop_requested:
        return "stopped", "stopped on request"
    how = "process gone (host rebooted or killed)"
    if rec is not None and rec.code is not None:
        how = f"exited with code {rec.code}" + (f": {rec.cause}" if rec.cause else "")
    elif rec is not None and rec.signal:
        how = rec.cause or f"killed by signal {rec.signal}"
    if st.restarting and rec is not None:
        return "restarting", (f"{how}; the supervisor restarts it in {rec.restart_in_s or 0:g}s "
                              f"(restart {rec.restarts})")
    if rec is not None and rec.gave_up:
        how = f"the supervisor gave up after {rec.restarts} restart(s): {rec.reason}"
    return "dead", how


def status_row(target: ServiceTarget, st: ServerStatus, launch: LaunchRecord) -> dict[str, Any]:
    """One status row from the facts (before /server_info): state, pid, model, readiness."""
    state, detail = _state(st)
    out: dict[str, Any] = {
        "host": target.label, "kind": target.kind, "state_dir": target.state_dir,
        "url": target.url, "restarts": st.restarts, "last_cause": st.last_cause,
        "pid": st.process.pid if st.running else None, "uptime_s": st.process.uptime_s,
        "model": launch.model, "speculative_algorithm": launch.speculative_algorithm,
        "managed_by": (st.pidfile.managed_by if st.pidfile else None) or launch.managed_by,
        "ready": False, "accept_length": None, "version": None, "detail": detail,
        "state": state,
    }
    if st.foreign_listener is not None:
        out["detail"] = (f"port {target.port} held by a process not started by us (pid "
                         f"{st.foreign_listener.pid})")
    health = st.health
    out["ready"] = health is not None and health.ok and state == "running"
    if state == "running" and not out["ready"]:
        out["detail"] = "starting: " + ((health.error or f"/health {health.status}")
                                        if health else "port not listening yet")
    return out


def add_server_info(row: dict[str, Any], res: HttpAnswer) -> None:
    """Version, accept length and algorithm from /server_info (or why it was refused)."""
    info = res.json_if_ok()
    if isinstance(info, dict):
        row["version"] = info.get("version")
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            row["accept_length"] = states[0].get("avg_spec_accept_length")
        row["speculative_algorithm"] = info.get("speculative_algorithm",
                                                row["speculative_algorithm"])
    elif res.status == 401:
        row["detail"] = "/server_info needs the API key (--var api_key=... or SGLANG_API_KEY)"


def add_members(row: dict[str, Any], members: list[dict[str, Any]] | None) -> None:
    """A gateway's members on its row: ready only while every member is Ready and healthy."""
    row["members"] = members
    if members is None:
        row["ready"] = False
        row["detail"] = row["detail"] or "its worker list did not answer (/workers)"
        return
    good = [m for m in members if m.get("healthy") and str(m.get("status")).lower() == "ready"]
    row["ready"] = bool(row["ready"] and members and len(good) == len(members))
    summary = f"members {len(good)}/{len(members)} ready"
    row["detail"] = f"{row['detail']}; {summary}" if row["detail"] else summary


def verify_serving(row: dict[str, Any], target: ServiceTarget, host: Host) -> None:
    """`status --verify`: readiness proven by one greedy chat completion through the API
    (with the key), not only /health; a server that does not answer is not ready."""
    headers = {"Content-Type": "application/json", **(
        {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {})}
    body = json.dumps(chat_body(row.get("model"), "Say OK.", 4))
    res = host.fact(HttpAnswer, url=target.url + "/v1/chat/completions", method="POST",
                    headers=headers, body=body, timeout=60)
    try:
        chat_text(res.json_if_ok())
        row["verified"] = True
    except ValueError:
        row.update(ready=False, verified=False,
                   detail=f"--verify: a chat completion failed: {res.what} {res.body[:160]}")


def add_load(row: dict[str, Any], target: ServiceTarget, host: Host, st: ServerStatus) -> None:
    """The running server's load phases from its log (orchestrator.sglang.timeline): "load"
    (one line) and "load_timeline" (epoch start/end per phase)."""
    if row["state"] != "running":
        return
    lines = host.fact(LogTail, path=target.layout.log, lines=5000).lines
    phases = timeline.anchored(timeline.parse(lines), st.started_at)
    row["load_timeline"] = [p.to_json() for p in phases]
    row["load"] = timeline.summary(phases) or None


def host_status(target: ServiceTarget, host: Host, verify: bool = False) -> dict[str, Any]:
    """The state of one service: running/restarting/stopped/dead, pid, uptime, model,
    readiness (with VERIFY, proven by a chat completion); a gateway's members.
    {"skip": True} for an optional one never started."""
    st = host.fact(ServerStatus, state_dir=target.state_dir, host=target.api_host,
                   port=target.port)
    if target.optional and st.pidfile is None:
        return {"host": target.label, "skip": True}
    row = status_row(target, st, LaunchRecord.read(host, target.layout))
    hook = getattr(SERVICE_KINDS.get(target.kind), "members", None)
    if hook is not None:
        if row["state"] == "running":
            add_members(row, hook(target, host))
        return row
    add_load(row, target, host, st)
    if row["ready"]:
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        add_server_info(row, host.fact(HttpAnswer, url=target.url + "/server_info",
                                       headers=headers, timeout=10))
        if verify:
            verify_serving(row, target, host)
    return row


def collect_status(targets: list[ServiceTarget], *, factory: TransportFactory | None = None,
                   budget: float = 10.0, verify: bool = False) -> list[dict[str, Any]]:
    """host_status for every target, in parallel; unreachable hosts are reported, not raised."""
    one = functools.partial(host_status, verify=verify)
    return [r for r in _on_each(targets, one, factory, budget) if not r.get("skip")]


def status_exit_code(rows: list[dict[str, Any]]) -> int:
    """3 if a host was unreachable, 1 if a server is not running and ready, else 0."""
    if any(r.get("state") == "unreachable" for r in rows):
        return 3
    return 0 if all(r.get("state") == "running" and r.get("ready") for r in rows) else 1


# ------------------------------------------------------------------------------ logs


def tail_logs(targets: list[ServiceTarget], lines: int = 50, *,
              factory: TransportFactory | None = None, budget: float = 10.0
              ) -> list[dict[str, Any]]:
    """The last `lines` lines of each host's server log: [{"host", "lines"|"error"}]."""
    def one(target: ServiceTarget, host: Host) -> dict[str, Any]:
        res = host.fact(LogTail, path=target.layout.log, lines=lines)
        if not res.exists:
            return {"host": target.label, "lines": [], "missing": target.layout.log,
                    "skip": target.optional}
        return {"host": target.label, "lines": list(res.lines)}

    return [r for r in _on_each(targets, one, factory, budget) if not r.get("skip")]


def _follow_one(target: ServiceTarget, host: Host, pos: tuple[int, int | None], partial: str,
                write: Callable[[str], None]) -> tuple[tuple[int, int | None], str]:
    """Print the new complete lines of one log; the new position and the unfinished line."""
    res = host.fact(LogChunk, path=target.layout.log, offset=pos[0], inode=pos[1])
    if res.rotated:
        write(f"{target.label} | --- log rotated (server restarted) ---")
        partial = ""
    *complete, rest = (partial + res.data).split("\n")
    for line in complete:
        write(f"{target.label} | {REDACTOR.redact(line.rstrip(chr(13)))}")
    return (res.offset, res.inode), rest


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
    hosts: dict[str, Host] = {}
    pos: dict[str, tuple[int, int | None]] = {}
    partial: dict[str, str] = {}
    try:
        for target in targets:
            host = hosts[target.name] = open_host(target, factory, budget)
            # one read: the lines shown and where following starts (no line lost in between)
            res = host.fact(LogTail, path=target.layout.log, lines=lines, complete=True)
            for line in res.lines:
                write(f"{target.label} | {REDACTOR.redact(line)}")
            pos[target.name] = (res.offset, res.inode)
        while not stop.is_set():
            for target in targets:
                pos[target.name], partial[target.name] = _follow_one(
                    target, hosts[target.name], pos[target.name], partial.get(target.name, ""),
                    write)
            stop.wait(interval)
    finally:
        for host in hosts.values():
            host.transport.close()


# ------------------------------------------------------------------------------ stop


def stop_host(target: ServiceTarget, host: Host, grace: float = 60.0) -> dict[str, Any]:
    """Stop one host's server gracefully (systemd unit or process group)."""
    st = host.fact(ServerStatus, state_dir=target.state_dir)
    unit = st.pidfile.systemd_unit if st.pidfile else None
    t0 = time.monotonic()
    if unit:
        r = host.run_argv(["systemctl", "stop", unit], timeout=grace + 30)
        if not r.ok:
            raise StageError(f"systemctl stop {unit} failed: {r.tail(5)}")
    res = ServerStop.from_answer(host.act("server_stop", state_dir=target.state_dir,
                                          grace=grace))
    out: dict[str, Any] = {"host": target.label, "pid": res.pid, "was_running": res.was_running,
                           "stopped": res.stopped, "forced": res.forced,
                           "seconds": round(time.monotonic() - t0, 2),
                           "skip": target.optional and not res.was_running}
    if res.holdouts:
        out["holdouts"] = to_data(res.holdouts)
    if res.error:
        out["error"] = res.error
    return out


def stop_all(targets: list[ServiceTarget], *, grace: float = 60.0,
             factory: TransportFactory | None = None, budget: float = 10.0
             ) -> list[dict[str, Any]]:
    """stop_host on every target, in parallel (an optional one that never ran is left out)."""
    rows = _on_each(targets, lambda target, host: stop_host(target, host, grace), factory,
                    budget)
    return [r for r in rows if not r.pop("skip", False)]
