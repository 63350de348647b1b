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

import os
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
from orchestrator.facts import to_data
from orchestrator.facts.http import HttpAnswer
from orchestrator.facts.logs import LogChunk, LogTail
from orchestrator.facts.server import ServerStatus, ServerStop
from orchestrator.host import Host
from orchestrator.plan import Selection, build_plan
from orchestrator.redact import REDACTOR
from orchestrator.sglang.api import DEFAULT_HOST, DEFAULT_PORT, local_url
from orchestrator.stages.sglang_server.layout import ServerLayout
from orchestrator.transports import AgentTransport, make_transport

TransportFactory = Callable[[HostSpec], AgentTransport]


@dataclass
class ServiceTarget:
    """One host's server: where its state lives and how to reach its API on the host."""

    name: str
    spec: HostSpec
    state_dir: str
    api_host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The API as seen on the host."""
        return local_url(self.api_host, self.port)

    @property
    def layout(self) -> ServerLayout:
        """The files of its state dir."""
        return ServerLayout(self.state_dir)


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
    pb = Playbook(name="service", stages=[StageSpec(id="noop", run="true")])
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
            port = int(variables.get("sglang_port") or DEFAULT_PORT)
        except (TypeError, ValueError):
            raise ConfigError(f"host {name}: sglang_port {variables.get('sglang_port')!r} is "
                              "not a port number") from None
        targets.append(ServiceTarget(
            name=name, spec=inv.hosts[name], state_dir=str(sdir),
            api_host=str(variables.get("sglang_host") or DEFAULT_HOST), port=port,
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
            return {"host": target.name, "state": "unreachable" if exc.exit_code == 3 else "error",
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
    """running / stopped / dead, and why."""
    if st.running:
        return "running", None
    if st.pidfile is None:
        return "stopped", "never started from this state dir"
    rec = st.exit
    if (rec is not None and rec.stop_requested) or st.stop_requested:
        return "stopped", "stopped on request"
    if rec is not None and rec.code is not None:
        return "dead", f"exited with code {rec.code}"
    if rec is not None and rec.signal:
        return "dead", f"killed by signal {rec.signal}"
    return "dead", "process gone (host rebooted or killed)"


def status_row(target: ServiceTarget, st: ServerStatus, launch: LaunchRecord) -> dict[str, Any]:
    """One status row from the facts (before /server_info): state, pid, model, readiness."""
    state, detail = _state(st)
    out: dict[str, Any] = {
        "host": target.name, "state_dir": target.state_dir, "url": target.url,
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


def host_status(target: ServiceTarget, host: Host) -> dict[str, Any]:
    """The state of one host's server: running/stopped/dead, pid, uptime, model, readiness."""
    st = host.fact(ServerStatus, state_dir=target.state_dir, host=target.api_host,
                   port=target.port)
    row = status_row(target, st, LaunchRecord.read(host, target.layout))
    if row["ready"]:
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        add_server_info(row, host.fact(HttpAnswer, url=target.url + "/server_info",
                                       headers=headers, timeout=10))
    return row


def collect_status(targets: list[ServiceTarget], *, factory: TransportFactory | None = None,
                   budget: float = 10.0) -> list[dict[str, Any]]:
    """host_status for every target, in parallel; unreachable hosts are reported, not raised."""
    return _on_each(targets, host_status, factory, budget)


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
            return {"host": target.name, "lines": [], "missing": target.layout.log}
        return {"host": target.name, "lines": list(res.lines)}

    return _on_each(targets, one, factory, budget)


def _follow_one(target: ServiceTarget, host: Host, pos: tuple[int, int | None], partial: str,
                write: Callable[[str], None]) -> tuple[tuple[int, int | None], str]:
    """Print the new complete lines of one log; the new position and the unfinished line."""
    res = host.fact(LogChunk, path=target.layout.log, offset=pos[0], inode=pos[1])
    if res.rotated:
        write(f"{target.name} | --- log rotated (server restarted) ---")
        partial = ""
    *complete, rest = (partial + res.data).split("\n")
    for line in complete:
        write(f"{target.name} | {REDACTOR.redact(line.rstrip(chr(13)))}")
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
                write(f"{target.name} | {REDACTOR.redact(line)}")
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
    out: dict[str, Any] = {"host": target.name, "pid": res.pid, "was_running": res.was_running,
                           "stopped": res.stopped, "forced": res.forced,
                           "seconds": round(time.monotonic() - t0, 2)}
    if res.holdouts:
        out["holdouts"] = to_data(res.holdouts)
    if res.error:
        out["error"] = res.error
    return out


def stop_all(targets: list[ServiceTarget], *, grace: float = 60.0,
             factory: TransportFactory | None = None, budget: float = 10.0
             ) -> list[dict[str, Any]]:
    """stop_host on every target, in parallel."""
    return _on_each(targets, lambda target, host: stop_host(target, host, grace), factory,
                    budget)
