"""The changes the `gateway` stage makes: smg's own launch check (parser, then a probe start on
a spare loopback port), the launch files (keys at 0600, gateway.json, the supervisor's spec) and
the start; and the membership reconciliation through the gateway's API."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.programs import marked_result
from orchestrator.host import Host
from orchestrator.remote import source
from orchestrator.sglang.gateway import DRAINING, membership
from orchestrator.sglang.launch import RESTART_ON_FAILURE
from orchestrator.stages.gateway.api import GatewayApi
from orchestrator.stages.sglang_server.layout import ServerLayout

#: the launcher shipped to the host (the supervisor runs it; the check runs its text with -c)
LAUNCHER = "gateway_launch"


class GatewayFiles(ServerLayout):
    """The gateway's files in its state dir besides ServerLayout's (pid, log, launch.json, the
    data-plane key `api_key`): gateway.json (args, worker URLs, key file paths: read by
    gateway_launch.py run), the launcher (the supervisor's child), the control-plane key."""

    @property
    def spec(self) -> str:
        return self.path("gateway.json")

    @property
    def launcher(self) -> str:
        return self.path(f"{LAUNCHER}.py")

    @property
    def control_key(self) -> str:
        return self.path("control_plane_key")


@dataclass(frozen=True)
class Desired:
    """What a launch would be: smg's args (no workers, no keys), the worker URLs by inventory
    host, the fingerprint (worker URLs excluded) and the installed smg version."""

    args: list[str]
    urls: dict[str, str]
    fingerprint: dict[str, Any]
    version: str | None


def native_check(host: Host, p: Any, desired: Desired, *, probe: bool) -> None:
    """smg's own verdict on the launch (remote/gateway_launch.py check): its parser, its
    validation and, with `probe`, a start on a spare loopback port that must answer /health.
    A refusal fails the stage; nothing running was touched."""
    spec = {"args": desired.args, "worker_urls": list(desired.urls.values()),
            "keys": {"api_key": bool(p.api_key), "control_plane_key": bool(p.control_plane_key)},
            "probe": probe, "probe_timeout": p.probe_timeout}
    r = host.run_argv([p.python, "-c", source(LAUNCHER), "check", json.dumps(spec)],
                      timeout=p.probe_timeout + 60)
    try:
        got = marked_result(r.stdout)
    except ValueError:
        got = None
    if not isinstance(got, dict):
        raise StageError(f"smg's own launch check gave no answer: {r.tail(3)}")
    if not got.get("available"):
        raise StageError(f"smg does not import in {p.python}: {got.get('message')}",
                         hint="install smg in the gateway's venv (a pip_install stage before)")
    if not got.get("ok"):
        what = "start on a spare port" if got.get("kind") in ("start", "timeout") else "parser"
        raise StageError(f"smg refuses the launch ({got.get('kind')}, its {what}): "
                         f"{got.get('message')}",
                         hint="fix the gateway stage's parameters (extra_args, policy, settings);"
                         " the running gateway was left as it is")


def write_spec(host: Host, p: Any, desired: Desired) -> None:
    """gateway.json with the CURRENT desired worker list (a restart comes back with it)."""
    files = GatewayFiles(p.state_dir)
    spec = {"args": desired.args, "worker_urls": list(desired.urls.values()),
            "api_key_file": files.api_key if p.api_key else None,
            "control_plane_key_file": files.control_key if p.control_plane_key else None}
    host.write_file(files.spec, json.dumps(spec, indent=1) + "\n", mode=0o600)


def _write_key(host: Host, path: str, key: str | None) -> str | None:
    if key:
        host.write_file(path, key + "\n", mode=0o600)
        return path
    host.run_argv(["rm", "-f", path])
    return None


def write_launch(host: Host, p: Any, desired: Desired) -> None:
    """Keys (0600), gateway.json, the launcher, launch.json (the supervisor's) and the
    fingerprint."""
    files = GatewayFiles(p.state_dir)
    host.run_argv(["mkdir", "-p", p.state_dir], check=True, timeout=30, what="mkdir")
    host.run_argv(["chmod", "700", p.state_dir], check=True, timeout=30, what="chmod")
    keys = [k for k in (_write_key(host, files.api_key, p.api_key),
                        _write_key(host, files.control_key, p.control_plane_key)) if k]
    write_spec(host, p, desired)
    host.write_file(files.launcher, source(LAUNCHER), mode=0o644)
    launch = {"argv": [p.python, files.launcher, "run", files.spec], "env": dict(p.env),
              "log": files.log, "pid_file": files.pid, "exit_file": files.exit,
              "key_file": None, "key_files": keys, "restart": RESTART_ON_FAILURE,
              "fingerprint": desired.fingerprint["fingerprint"], "cwd": p.state_dir,
              "mkdirs": [], "managed_by": "background", "unit": None,
              "host": p.host, "port": p.port}
    host.write_file(files.launch, json.dumps(launch, indent=1) + "\n", mode=0o600)
    host.write_file(files.fingerprint, json.dumps(desired.fingerprint, indent=1) + "\n",
                    mode=0o600)


def reconcile(api: GatewayApi, want: list[str]) -> list[str]:
    """One pass: add each missing worker whose OWN /health answers 200 (from the gateway's
    host), remove each listed worker that is not desired (unless already draining); what was
    done, in words."""
    listed = api.workers()
    if listed is None:
        return []
    diff = membership(listed, want)
    done = []
    for url in diff.missing:
        if api.worker_health(url).ok:
            api.add(url)
            done.append(f"added {url}")
    for m in diff.unknown:
        if m.status != DRAINING and api.remove(m.url):
            done.append(f"removed {m.url}")
    return done
