"""Pure rules of the `sglang_server` stage (and the router's, which runs under the same
supervisor): typed facts and parameters in, a decision out; and the launch's pin (`deploy
--locked`): what it records and how a launch differs. The API key is not pinned (per environment).

No host is touched here; tests/stages/sglang_rules/*.json and tests/test_pinfile.py drive these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StageError
from orchestrator.facts.hardware import GpuUser
from orchestrator.facts.server import ExitRecord, Listener, ServerStatus, SystemdInfo
from orchestrator.pinfile import StagePin
from orchestrator.sglang import launch
from orchestrator.stages.pin import arg_changes, bind_scope, placeholders


@dataclass(frozen=True)
class Verdict:
    """What the running server means: converged (nothing to do) or why a launch is needed."""

    converged: bool
    reason: str


def fmt_cmd(argv: list[str] | tuple[str, ...], limit: int = 160) -> str:
    """A command line for a message, cut to `limit` characters."""
    text = " ".join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_foreign(listener: Listener) -> str:
    """Who holds the port, for a message."""
    if listener.pid is None:
        return "a process this user cannot see"
    return f"pid {listener.pid}, cmdline {fmt_cmd(listener.cmdline) or '?'}"


def stale_refusal(listener: Listener, held: list[GpuUser], *, bind: str, port: int,
                  stop_stale: bool) -> StageError | None:
    """A foreign process on our port: an error unless `stop_stale` (then None)."""
    if stop_stale:
        return None
    who = describe_foreign(listener)
    if held:
        who += (f"; it also holds {sum(a.used_mib or 0 for a in held)} MiB on "
                f"{len(held)} GPU(s)")
    return StageError(f"a process not started by us ({who}) holds {bind}:{port}",
                      hint=f"stop it (kill {listener.pid}) or set `stop_stale: true` on this "
                      "stage to have it stopped, or use another port")


def _same_launch(status: ServerStatus, want: str) -> bool:
    recorded = status.recorded_fingerprint
    pid_fp = status.pidfile.fingerprint if status.pidfile else None
    return status.fingerprint is not None and recorded == want and pid_fp in (None, want)


def restart_note(status: ServerStatus) -> str:
    """What the supervisor did about failures (restart on failure), for a reason; "" if none."""
    rec = status.exit
    if status.restarting and rec is not None:
        return (f"; its supervisor restarts it in {rec.restart_in_s or 0:g}s (restart "
                f"{rec.restarts})")
    if rec is not None and rec.gave_up:
        return f"; its supervisor gave up: {rec.reason}"
    if status.running and status.restarts:
        cause = status.last_cause
        return f", restarted {status.restarts}x by its supervisor" + (
            f" (last exit: {cause})" if cause else "")
    return ""


def _running_verdict(status: ServerStatus, desired_fp: dict[str, Any],
                     restart_after: float) -> Verdict:
    pid = f"{status.process.pid}{restart_note(status)}"
    if not _same_launch(status, desired_fp["fingerprint"]):
        changes = launch.diff_fingerprints(status.fingerprint, desired_fp)
        return Verdict(False, "running with a different launch fingerprint (changed: "
                       + "; ".join(changes) + ")")
    uptime = status.process.uptime_s or 0.0
    health = status.health
    if health is not None and health.ok:
        return Verdict(True, f"running (pid {pid}, up {uptime:.0f}s) with the same launch "
                       "fingerprint; /health 200")
    state = (health.error if health else None) or \
        f"/health {health.status if health else None}"
    if status.listener is None:
        state = "port not listening yet"
    if uptime < restart_after:
        return Verdict(True, f"running (pid {pid}, up {uptime:.0f}s) with the same launch "
                       f"fingerprint, still loading ({state}); wait_ready waits for it")
    return Verdict(False, f"running (pid {pid}) but not healthy ({state}) {uptime:.0f}s after "
                   "its start: restart")


def exit_how(rec: ExitRecord) -> str:
    """"exit code N" or "signal N"."""
    return f"exit code {rec.code}" if rec.code is not None else f"signal {rec.signal}"


def server_verdict(status: ServerStatus, desired_fp: dict[str, Any], *, port: int,
                   restart_after: float) -> Verdict:
    """Converged when our server runs with the same fingerprint (healthy, or still loading)."""
    foreign = status.foreign_listener
    if status.running and foreign is None:
        return _running_verdict(status, desired_fp, restart_after)
    reason = "not running"
    rec = status.exit
    if rec is not None and not rec.stop_requested:
        reason += f" (the last server exited with {exit_how(rec)}{restart_note(status)})"
    elif status.pidfile is not None and not status.stop_requested and rec is None:
        reason += " (the recorded server is gone)"
    if status.running:
        reason = f"running (pid {status.process.pid})"
    if foreign is not None:
        reason += (f"; a process not started by us ({describe_foreign(foreign)}) holds port "
                   f"{port}: it will be stopped (stop_stale)")
    return Verdict(False, reason)


def other_gpu_users(status: ServerStatus, processes: tuple[GpuUser, ...] | list[GpuUser],
                    *, stop_stale: bool) -> list[str]:
    """GPU memory held by processes that are not our running server, one line per pid."""
    ours: set[int | None] = set()
    if status.running and status.pidfile is not None:
        ours = {status.pidfile.pid, status.pidfile.supervisor_pid}
    per_pid: dict[int, list[GpuUser]] = {}
    for a in processes:
        if a.pid not in ours:
            per_pid.setdefault(a.pid, []).append(a)
    listener = status.listener
    out = []
    for pid, rows in sorted(per_pid.items()):
        mib = sum(r.used_mib or 0 for r in rows)
        note = " (on our port: stop_stale stops it)" if listener is not None and \
            listener.pid == pid and stop_stale else ""
        out.append(f"pid {pid} ({rows[0].name}, {len(rows)} GPU(s), {mib} MiB){note}")
    return out


def launch_mode(systemd: str, info: SystemdInfo | None) -> str:
    """"systemd" or "background", from the `systemd:` parameter and the host."""
    if systemd == "never" or info is None:
        return "background"
    if systemd == "always" and not info.usable:
        raise StageError(
            "systemd: always, but this host is not run by systemd (PID 1: "
            f"{info.pid1}, systemctl: {info.systemctl or 'missing'}, uid "
            f"{info.uid})", hint="use systemd: auto or never")
    return "systemd" if info.usable else "background"


def started_too_soon(status: ServerStatus, pid: Any) -> str | None:
    """verify: why the server we started is gone (None while it lives)."""
    if status.running and status.pidfile is not None and status.pidfile.pid == pid:
        return None
    rec = status.exit
    if rec is not None and rec.code is not None:
        return f"exit code {rec.code}"
    if rec is not None and rec.signal:
        return f"signal {rec.signal}"
    return "no exit record"


# ------------------------------------------------------------------ the pin (deploy --locked)

@dataclass(frozen=True)
class ServerPin(StagePin):
    """sglang_server's pin: the SGLang version, the launch arguments (host paths and --host as
    placeholders), how far --host reaches, and the environment (names, sha256 of the values).
    On disk: {sglang_version, args, bind, env: {names, sha256}}."""

    sglang_version: str | None
    args: tuple[str, ...]
    bind: str | None
    env_names: tuple[str, ...] = ()
    env_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The pin file's entry."""
        return {"sglang_version": self.sglang_version, "args": list(self.args),
                "bind": self.bind, "env": {"names": list(self.env_names),
                                           "sha256": self.env_sha256}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerPin:
        """An entry of the pin file (missing keys read as None / empty)."""
        env = data.get("env") if isinstance(data.get("env"), dict) else {}
        return cls(data.get("sglang_version"), tuple(data.get("args") or ()), data.get("bind"),
                   tuple(env.get("names") or ()), env.get("sha256"))


def launch_pin(args: list[str], env: Mapping[str, str], paths: Mapping[str, str | None],
               sglang_version: str | None) -> ServerPin:
    """The pin of an SGLang launch.

    args: the server arguments with host paths replaced by placeholders (<model_path>,
    <draft_model_path>, <state_dir>, <cache_dir>, <python>) and the value of --host replaced by
    "<host>" (each host binds its own address); the reach of that address is kept as "bind"
    (loopback / all / address), so exposing the API on every interface is a difference. --port is
    kept as it is, and so is the port of --dist-init-addr (multi-node), whose address becomes
    "<node0>" (node 0's address differs per environment). env: the variable NAMES and a sha256
    over "NAME=value" lines with the same placeholders (values may be secrets: never stored).
    """
    norm = placeholders(paths, args)
    host = None
    for i, a in enumerate(args):
        if a == "--host" and i + 1 < len(args):
            host = args[i + 1]
            norm[i + 1] = "<host>"
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
            norm[i] = "--host=<host>"
        elif a == "--dist-init-addr" and i + 1 < len(args):
            norm[i + 1] = "<node0>:" + args[i + 1].rpartition(":")[2]
    names = sorted(env)
    values = placeholders(paths, [env[n] for n in names])
    digest = hashlib.sha256("".join(f"{n}={v}\n" for n, v in zip(names, values, strict=True))
                            .encode("utf-8")).hexdigest()
    return ServerPin(sglang_version, tuple(norm), bind_scope(host), tuple(names), digest)


def pin_drift(entry: ServerPin, pin: ServerPin) -> list[str]:
    """How this launch differs from the pinned one: args, bind, environment (not the version)."""
    drift = []
    if entry.args != pin.args:
        drift.append("launch arguments (pin -> this deploy): "
                     + "; ".join(arg_changes(pin.args, entry.args)))
    if entry.bind != pin.bind:
        drift.append(f"--host reaches {entry.bind}, the pin's reached {pin.bind}")
    if (entry.env_names, entry.env_sha256) != (pin.env_names, pin.env_sha256):
        a, b = set(pin.env_names), set(entry.env_names)
        what = [f"+{n}" for n in sorted(b - a)] + [f"-{n}" for n in sorted(a - b)]
        drift.append("server environment: " + (", ".join(what) if what else
                                               "a value changed (sha256 differs)"))
    return drift


def version_drift(have: str | None, want: str | None, *, dry_run: bool) -> tuple[str, str] | None:
    """("needed" | "refuse", message) when the installed SGLang is not the pinned one."""
    if have is None or have == want:
        # not installed: under plan the packages stage would install the pinned version;
        # under deploy the preflight reports the broken venv
        return None
    if dry_run:
        return ("needed", f"drift: sglang {have} installed, the pin has {want} (deploy "
                "--locked installs the pinned version first, then restarts)")
    return ("refuse", f"sglang version: this deploy would run {have}, the pin has {want}")
