"""The change `sglang_server` makes: stop what must go, write the launch files, start the
supervisor (setsid, or a systemd unit). Reads go through typed facts (orchestrator.facts)."""

from __future__ import annotations

import json
import time
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.server import (
    PidFile,
    ProcessStop,
    ServerStart,
    ServerStatus,
    ServerStop,
)
from orchestrator.host import Host
from orchestrator.remote import source
from orchestrator.sglang import launch
from orchestrator.stages.base import StageContext
from orchestrator.stages.sglang_server.layout import ServerLayout
from orchestrator.stages.sglang_server.reads import Desired
from orchestrator.stages.sglang_server.rules import describe_foreign, fmt_cmd


def indent(text: str, prefix: str = "    ") -> str:
    """Every line of TEXT indented (log tails in messages)."""
    return "\n".join(prefix + line for line in text.splitlines())


def stop_ours(host: Host, p: Any, status: ServerStatus) -> ServerStop:
    """Stop our previous server (its systemd unit first, when systemd runs it)."""
    unit = status.pidfile.systemd_unit if status.pidfile else None
    if unit:
        host.run_argv(["systemctl", "stop", unit], timeout=p.stop_timeout + 30)
    res = ServerStop.from_answer(host.act("server_stop", state_dir=p.state_dir,
                                     grace=p.stop_timeout))
    if res.error or not res.stopped:
        raise StageError(f"could not stop the previous server (pid {res.pid}): "
                         f"{res.error or 'still alive after SIGKILL'}")
    return res


def stop_stale(host: Host, ctx: StageContext, p: Any, status: ServerStatus) -> None:
    """Stop a foreign process holding our port (stop_stale: true)."""
    listener = status.foreign_listener
    if listener is None or not p.stop_stale:
        return
    if listener.pid is None:
        raise StageError(f"a process we cannot see holds {p.host}:{p.port}",
                         hint="stop it by hand (run as root?)")
    ctx.progress(f"stopping the stale process {listener.pid} on port {p.port}")
    res = ProcessStop.from_answer(host.act("process_stop", pid=listener.pid,
                                      grace=p.stop_timeout))
    if res.error or not res.stopped:
        raise StageError(f"could not stop the stale process {listener.pid}: "
                         f"{res.error or 'still alive after SIGKILL'}")
    ctx.record("stopped_stale", {"pid": listener.pid, "forced": res.forced,
                                 "cmdline": fmt_cmd(listener.cmdline)})


def stop_previous(host: Host, ctx: StageContext, p: Any, status: ServerStatus) -> None:
    """Stop our previous server and (with stop_stale) a foreign one; wait for the port."""
    if status.process.same_process or status.process.supervisor_alive:
        old = status.process.pid
        ctx.progress(f"stopping the previous server (pid {old})")
        res = stop_ours(host, p, status)
        ctx.record("stopped_previous", {"pid": old, "forced": res.forced,
                                        "waited_s": res.waited_s})
    stop_stale(host, ctx, p, status)
    wait_port_free(host, p)


def wait_port_free(host: Host, p: Any, timeout: float = 15.0) -> None:
    """Until nothing listens on host:port (a stopped server may linger a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        st = host.fact(ServerStatus, state_dir=p.state_dir, host=p.host, port=p.port,
                       health_path="")
        if st.listener is None:
            return
        if time.monotonic() > deadline:
            raise StageError(
                f"port {p.host}:{p.port} is still held ({describe_foreign(st.listener)}) "
                f"{timeout:.0f}s after stopping the previous server",
                hint="stop that process, or use another port")
        time.sleep(0.1)


def restart_policy(p: Any) -> dict[str, Any] | None:
    """The launch spec's "restart" (restart_on_failure, on by default), or None: never
    restarted. Never for a multi-node group: its world is formed once, by
    torch.distributed.init_process_group over the dist-init address (sglang 0.5.23
    srt/distributed/parallel_state.py:2517-2524, from bootstrap.py:322-332); a rank started
    again alone cannot rejoin it (only the mooncake EP backend's `recovered_rank` can,
    parallel_state.py:2500-2512), so the next deploy restarts the whole group."""
    policy = getattr(p, "restart_on_failure", False)
    if not policy or len(getattr(p, "nodes", None) or []) > 1:
        return None
    if policy is True:
        return dict(launch.RESTART_ON_FAILURE)
    return {"max": policy.max, "window_s": policy.window, "backoff_s": policy.backoff,
            "backoff_max_s": policy.backoff_max}


def launch_spec(p: Any, layout: ServerLayout, desired: Desired, mode: str,
                key_file: str | None) -> dict[str, Any]:
    """STATE_DIR/launch.json: what the supervisor runs, and what `status` shows."""
    env = desired.env
    restart = restart_policy(p)
    return {**({"restart": restart} if restart else {}),
        "argv": launch.server_argv(p.python, key_file, desired.args), "env": env,
        "log": layout.log, "pid_file": layout.pid, "exit_file": layout.exit,
        "key_file": key_file, "fingerprint": desired.fingerprint["fingerprint"],
        "cwd": p.state_dir,
        "mkdirs": sorted({v for k, v in env.items() if k in launch.CACHE_ENV}),
        "managed_by": mode, "unit": launch.unit_name(p.unit_name) if mode == "systemd"
        else None,
        "served_model_name": p.served_model_name, "model_path": p.model_path,
        "speculative_algorithm": p.speculative.algorithm if p.speculative else None,
        "host": p.host, "port": p.port,
    }


def write_launch_files(host: Host, p: Any, desired: Desired, mode: str) -> None:
    """The key file (0600, or none), launch.json and fingerprint.json."""
    layout = ServerLayout(p.state_dir)
    key_file = layout.api_key if p.api_key else None
    if key_file:
        host.write_file(key_file, p.api_key + "\n", mode=0o600)
    else:
        host.run_argv(["rm", "-f", layout.api_key])
    spec = launch_spec(p, layout, desired, mode, key_file)
    host.write_file(layout.launch, json.dumps(spec, indent=1) + "\n", mode=0o600)
    host.write_file(layout.fingerprint, json.dumps(desired.fingerprint, indent=1) + "\n",
                    mode=0o600)


def start_background(host: Host, p: Any, what: str = "server") -> PidFile | None:
    """The supervisor of the server (or the router) in its own session (`server_start`)."""
    res = ServerStart.from_answer(host.act("server_start", state_dir=p.state_dir,
                                      python=p.python))
    if res.error is not None:
        tail = "\n".join(res.log_tail) or res.stderr or ""
        raise StageError(f"the {what} could not be started: {res.error}"
                         + (f"\n  last log lines:\n{indent(tail)}" if tail else ""))
    return res.pidfile


def start_systemd(host: Host, p: Any, started_at: float) -> PidFile | None:
    """Write the unit, restart it, and wait for its server's pid file."""
    layout = ServerLayout(p.state_dir)
    unit = launch.unit_name(p.unit_name)
    host.write_file(layout.supervisor, source("supervisor"), mode=0o644)
    text = launch.unit_file(
        unit=unit, description=f"SGLang server {p.served_model_name or p.model_path} "
        "(orchestrator)", python=p.python, supervisor=layout.supervisor,
        launch_file=layout.launch, state_dir=p.state_dir, stop_timeout=p.stop_timeout + 10,
        restart=restart_policy(p))
    host.write_file(f"/etc/systemd/system/{unit}", text, mode=0o644)
    host.run_argv(["systemctl", "daemon-reload"], check=True, timeout=60,
                  what="systemctl daemon-reload")
    # systemd.unit(5) StartLimitIntervalSec=: manual starts count against the limit too, and
    # `systemctl reset-failed` flushes the counter: a deploy is not refused by earlier ones.
    host.run_argv(["systemctl", "reset-failed", unit], timeout=60)
    host.run_argv(["systemctl", "restart", unit], check=True, timeout=120,
                  what=f"systemctl restart {unit}")
    action = "enable" if p.autostart else "disable"
    host.run_argv(["systemctl", action, unit], check=True, timeout=60,
                  what=f"systemctl {action} {unit}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pf = host.fact(ServerStatus, state_dir=p.state_dir).pidfile
        if pf is not None and (pf.started_at or 0) >= started_at - 1:
            return pf
        time.sleep(0.2)
    r = host.run_argv(["systemctl", "status", "--no-pager", unit], timeout=30)
    raise StageError(f"systemd started {unit} but its server never wrote "
                     f"{layout.pid}:\n{indent(r.tail(15))}")
