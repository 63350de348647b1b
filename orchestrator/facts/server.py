"""Facts about the SGLang server of a state dir, and the answers of the actions on it.

    status = host.fact(ServerStatus, state_dir=..., host=..., port=...)

`ServerStatus` is the `server_status` probe (orchestrator/remote/server.py): the pid file, the
process view (the very process we started, not a recycled pid), the exit record, who listens on
the port, /health, the recorded fingerprint and a log tail. `ServerStart`, `ServerStop`,
`ProcessStop` are the answers of the actions that start and stop servers; `SystemdInfo` says
whether systemd runs the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchestrator.facts.base import as_dict as _d
from orchestrator.facts.base import as_str as _str
from orchestrator.facts.base import as_whole as _int
from orchestrator.facts.base import fact
from orchestrator.facts.http import HttpAnswer


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _argv(value: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in value) if isinstance(value, (list, tuple)) else ()


def _last_cause(exits: Any) -> str | None:
    """The cause of the last of the supervisor's recorded exits."""
    if isinstance(exits, list) and exits and isinstance(exits[-1], dict):
        return _str(exits[-1].get("cause"))
    return None


@dataclass(frozen=True)
class PidFile:
    """STATE_DIR/server.pid, written by the supervisor once the server process exists."""

    pid: int | None
    pgid: int | None
    supervisor_pid: int | None
    started_at: float | None
    fingerprint: str | None
    managed_by: str | None
    unit: str | None
    #: how many times the supervisor restarted the server (restart on failure); 0 = first start
    restarts: int = 0
    #: why the server exited before this start (the supervisor's last exit's cause), if it did
    last_cause: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> PidFile | None:
        """None when there is no pid file (never started from this state dir)."""
        if not isinstance(raw, dict) or not raw:
            return None
        return cls(pid=_int(raw.get("pid")), pgid=_int(raw.get("pgid")),
                   supervisor_pid=_int(raw.get("supervisor_pid")),
                   started_at=_float(raw.get("started_at")),
                   fingerprint=_str(raw.get("fingerprint")),
                   managed_by=_str(raw.get("managed_by")), unit=_str(raw.get("unit")),
                   restarts=_int(raw.get("restarts")) or 0,
                   last_cause=_last_cause(raw.get("exits")))

    @property
    def systemd_unit(self) -> str | None:
        """The unit that runs this server, when systemd does."""
        return self.unit if self.managed_by == "systemd" and self.unit else None


@dataclass(frozen=True)
class ProcessView:
    """The recorded server process: alive, and the very process we started?"""

    pid: int | None
    alive: bool
    same_process: bool
    supervisor_alive: bool
    uptime_s: float | None

    @classmethod
    def parse(cls, raw: Any) -> ProcessView:
        """Parse the probe's "process" dict."""
        r = _d(raw)
        return cls(pid=_int(r.get("pid")), alive=bool(r.get("alive")),
                   same_process=bool(r.get("same_process")),
                   supervisor_alive=bool(r.get("supervisor_alive")),
                   uptime_s=_float(r.get("uptime_s")))


@dataclass(frozen=True)
class ExitRecord:
    """STATE_DIR/server.exit: how the last server ended (code or signal), and what the
    supervisor does about it: `restarting` (in `restart_in_s`), or `gave_up` (`reason`)."""

    code: int | None
    signal: int | None
    stop_requested: bool
    restarting: bool = False
    restart_in_s: float | None = None
    gave_up: bool = False
    reason: str | None = None
    restarts: int = 0
    #: why it exited: killed by a signal, or the last error line it printed
    cause: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> ExitRecord | None:
        """None when the last server has not exited (or the record is an older run's)."""
        if not isinstance(raw, dict) or not raw:
            return None
        return cls(code=_int(raw.get("code")), signal=_int(raw.get("signal")),
                   stop_requested=bool(raw.get("stop_requested")),
                   restarting=bool(raw.get("restarting")),
                   restart_in_s=_float(raw.get("restart_in_s")),
                   gave_up=bool(raw.get("gave_up")), reason=_str(raw.get("reason")),
                   restarts=_int(raw.get("restarts")) or 0, cause=_str(raw.get("cause")))


@dataclass(frozen=True)
class Listener:
    """Who listens on the server's port; `ours` when it is our server's process group."""

    pid: int | None
    cmdline: tuple[str, ...]
    address: str | None
    ours: bool

    @classmethod
    def parse(cls, raw: Any) -> Listener | None:
        """None when the port is free."""
        if not isinstance(raw, dict):
            return None
        return cls(pid=_int(raw.get("pid")), cmdline=_argv(raw.get("cmdline")),
                   address=_str(raw.get("address")), ours=bool(raw.get("ours")))

    @property
    def foreign(self) -> bool:
        """A process not started by us."""
        return not self.ours


@fact
@dataclass(frozen=True)
class ServerStatus:
    """Everything known about the server of a state dir, in one round trip."""

    probe: ClassVar[str] = "server_status"

    state_dir: str
    pidfile: PidFile | None
    process: ProcessView
    exit: ExitRecord | None
    stop_requested: bool
    #: STATE_DIR/fingerprint.json as the stage wrote it (orchestrator.sglang.launch.fingerprint)
    fingerprint: dict[str, Any] | None
    launch_exists: bool
    log_path: str
    listener: Listener | None
    health: HttpAnswer | None
    log_tail: tuple[str, ...] = field(default=())

    @classmethod
    def from_answer(cls, answer: Any) -> ServerStatus:
        """Parse the probe's dict."""
        a = _d(answer)
        fp = a.get("fingerprint")
        health = a.get("health")
        return cls(
            state_dir=str(a.get("state_dir") or ""), pidfile=PidFile.parse(a.get("pidfile")),
            process=ProcessView.parse(a.get("process")), exit=ExitRecord.parse(a.get("exit")),
            stop_requested=bool(a.get("stop_requested")),
            fingerprint=fp if isinstance(fp, dict) else None,
            launch_exists=bool(a.get("launch_exists")), log_path=str(a.get("log_path") or ""),
            listener=Listener.parse(a.get("listener")),
            health=HttpAnswer.from_answer(health) if isinstance(health, dict) else None,
            log_tail=tuple(str(x) for x in a.get("log_tail") or ()),
        )

    @property
    def running(self) -> bool:
        """The recorded server is alive (the same process, not a recycled pid)."""
        return self.process.same_process

    @property
    def restarting(self) -> bool:
        """The server died and its supervisor (alive) is about to start it again."""
        return bool(self.exit is not None and self.exit.restarting and not self.running
                    and self.process.supervisor_alive)

    @property
    def restarts(self) -> int:
        """How many times the supervisor restarted the server (pid file, or the exit record
        while it waits to restart)."""
        return max(self.pidfile.restarts if self.pidfile else 0,
                   self.exit.restarts if self.exit else 0)

    @property
    def last_cause(self) -> str | None:
        """Why the server last exited on its own (the exit record, or, once its supervisor
        started it again, the pid record's last exit)."""
        if self.exit is not None and not self.exit.stop_requested and self.exit.cause \
                and not self.running:
            return self.exit.cause
        return self.pidfile.last_cause if self.pidfile else None

    @property
    def started_at(self) -> float | None:
        """When the recorded server was started (epoch), from the pid file."""
        return self.pidfile.started_at if self.pidfile else None

    @property
    def recorded_fingerprint(self) -> str | None:
        """The fingerprint the running server was launched with."""
        fp = (self.fingerprint or {}).get("fingerprint")
        return fp if isinstance(fp, str) else None

    @property
    def foreign_listener(self) -> Listener | None:
        """The listener on the port when it is not our server."""
        return self.listener if self.listener is not None and self.listener.foreign else None


@fact
@dataclass(frozen=True)
class ServerStart:
    """The `server_start` action's answer: the new pid file, or why the supervisor died."""

    probe: ClassVar[str] = "server_start"

    pidfile: PidFile | None
    error: str | None
    stderr: str
    log_tail: tuple[str, ...]
    repeated: bool

    @classmethod
    def from_answer(cls, answer: Any) -> ServerStart:
        """Parse the action's dict."""
        a = _d(answer)
        return cls(pidfile=PidFile.parse(a.get("pidfile")), error=_str(a.get("error")),
                   stderr=str(a.get("stderr") or ""),
                   log_tail=tuple(str(x) for x in a.get("log_tail") or ()),
                   repeated=bool(a.get("repeated")))


@dataclass(frozen=True)
class Holdout:
    """A process of the group still alive at SIGKILL time (what ignored the SIGTERM)."""

    pid: int | None
    comm: str
    state: str
    wchan: str

    @classmethod
    def parse(cls, raw: Any) -> Holdout:
        """Parse one holdout dict."""
        r = _d(raw)
        return cls(pid=_int(r.get("pid")), comm=str(r.get("comm") or ""),
                   state=str(r.get("state") or ""), wchan=str(r.get("wchan") or ""))


def _stop_fields(a: dict[str, Any]) -> dict[str, Any]:
    return {"pid": _int(a.get("pid")), "was_running": bool(a.get("was_running")),
            "stopped": bool(a.get("stopped", True)), "forced": bool(a.get("forced")),
            "waited_s": _float(a.get("waited_s")), "error": _str(a.get("error"))}


@dataclass(frozen=True)
class StopResult:
    """What stopping a process group answered (shared by server_stop and process_stop)."""

    pid: int | None
    was_running: bool
    stopped: bool
    forced: bool
    waited_s: float | None
    error: str | None


@fact
@dataclass(frozen=True)
class ServerStop(StopResult):
    """The `server_stop` action's answer (SIGTERM the group, SIGKILL after the grace)."""

    probe: ClassVar[str] = "server_stop"

    holdouts: tuple[Holdout, ...]

    @classmethod
    def from_answer(cls, answer: Any) -> ServerStop:
        """Parse the action's dict."""
        a = _d(answer)
        return cls(**_stop_fields(a),
                   holdouts=tuple(Holdout.parse(h) for h in a.get("holdouts") or ()))


@fact
@dataclass(frozen=True)
class ProcessStop(StopResult):
    """The `process_stop` action's answer (a stale process of someone else)."""

    probe: ClassVar[str] = "process_stop"

    cmdline: tuple[str, ...]

    @classmethod
    def from_answer(cls, answer: Any) -> ProcessStop:
        """Parse the action's dict."""
        a = _d(answer)
        return cls(**_stop_fields(a), cmdline=_argv(a.get("cmdline")))


@fact
@dataclass(frozen=True)
class SystemdInfo:
    """Whether systemd runs this host (PID 1) and systemctl exists, and our uid."""

    probe: ClassVar[str] = "systemd"

    booted: bool
    pid1: str | None
    systemctl: str | None
    uid: int | None

    @classmethod
    def from_answer(cls, answer: Any) -> SystemdInfo:
        """Parse the probe's dict."""
        a = _d(answer)
        return cls(booted=bool(a.get("booted")), pid1=_str(a.get("pid1")),
                   systemctl=_str(a.get("systemctl")), uid=_int(a.get("uid")))

    @property
    def usable(self) -> bool:
        """We can run a unit: systemd is PID 1, systemctl exists, we are root."""
        return bool(self.booted and self.systemctl and self.uid == 0)
