"""The server supervisor: run a server, mask its keys in its log, record its exit, restart it.

A stand-alone program (stdlib only, Python 3.8+; it imports nothing of the package): the action
`server_start` (orchestrator.remote.actions) and the sglang_server stage write its text to
STATE_DIR/supervise.py, and it runs as `PYTHON STATE_DIR/supervise.py STATE_DIR/launch.json` (by
the agent with setsid, or by systemd). It is the session leader: the server and everything it
spawns share its process group, so one killpg() stops them all. It forwards SIGTERM to the
server, masks every key (`key_file`, `key_files`) before a byte reaches the log, and writes the
pid and exit records.

Restart on failure (the launch spec's `"restart": {"max", "window_s", "backoff_s",
"backoff_max_s"}`; absent: never): a server that exited non-zero or by a signal while no stop was
requested is started again after a doubling delay (backoff_s, 2*backoff_s, ... capped at
backoff_max_s; the doubling counts the restarts within window_s); once `max` restarts fall within
`window_s` the supervisor gives up. Each start rewrites the pid record (new pid, starttime,
`restarts`); each exit writes the exit record (`restarting` + `restart_in_s` while it waits,
`gave_up` + `reason` when it gave up), with the `cause` of each exit (the signal, or the last
error line the server printed, as masked in the log) and the last few exits (`exits`), which the
next pid record carries too, so `status` names why a server that runs again was restarted.
A stop (the `stop_requested` marker that server_stop writes,
or SIGTERM/SIGINT/SIGHUP to the supervisor or its group) never restarts, and ends a backoff wait
at once. Exit status: 0 (server exit 0, or stopped), 1 (server failed, no restart asked), 3
(GAVE_UP), 127 (the server cannot be executed): systemd's RestartPreventExitStatus= names 3 and 127
so only the supervisor's own death is restarted by the unit.

It also holds the two /proc readers the other host modules share (`boot_id`, `starttime`): it
must carry its own, so they live here once.
"""

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

MASK = b"***"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
GAVE_UP = 3
CANNOT_START = 127


def boot_id(path: str = BOOT_ID) -> "str | None":
    """The kernel's boot id (changes at every boot), or None where /proc does not tell."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def starttime(pid: int) -> "int | None":
    """Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_json(path: str, obj: object) -> None:
    """Write OBJ as JSON to PATH atomically (temp file, fsync, rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def split_hold(buf: bytes, key: bytes) -> "tuple[bytes, bytes]":
    """(emit, hold): hold is the longest tail of buf that may be the start of the key."""
    for k in range(min(len(key) - 1, len(buf)), 0, -1):
        if buf.endswith(key[:k]):
            return buf[:-k], buf[-k:]
    return buf, b""


class Masker:
    """Replaces every KEY by MASK in a byte stream cut into chunks anywhere (even inside a key)."""

    def __init__(self, *keys: bytes) -> None:
        self.keys = sorted({k for k in keys if k}, key=len, reverse=True)
        self.hold = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of CHUNK that can be written now, masked."""
        buf = self.hold + chunk
        for key in self.keys:
            buf = buf.replace(key, MASK)
        held = max((len(split_hold(buf, key)[1]) for key in self.keys), default=0)
        self.hold = buf[len(buf) - held:] if held else b""
        return buf[:len(buf) - held]

    def flush(self) -> bytes:
        """What is still held back at the end of the stream."""
        hold, self.hold = self.hold, b""
        return hold


class Paths:
    """Where the launch spec says the supervisor writes (pid, exit, log, stop marker)."""

    def __init__(self, spec_path: str, spec: dict) -> None:
        self.spec = spec_path
        self.state = os.path.dirname(os.path.abspath(spec_path))
        self.log = spec["log"]
        self.pid = spec.get("pid_file") or os.path.join(self.state, "server.pid")
        self.exit = spec.get("exit_file") or os.path.join(self.state, "server.exit")
        self.stop_marker = os.path.join(self.state, "stop_requested")


def read_keys(spec: dict) -> "list[bytes]":
    """The keys to mask: `key_file` and every one of `key_files` (unreadable ones skipped)."""
    keys = []
    for path in filter(None, [spec.get("key_file"), *(spec.get("key_files") or [])]):
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            keys.append(fh.read().strip())
    return [k for k in keys if k]


class Restart:
    """The launch spec's "restart" policy and the restarts it has allowed so far."""

    def __init__(self, raw: dict) -> None:
        self.max = int(raw.get("max", 5))
        self.window_s = float(raw.get("window_s", 300))
        self.backoff_s = float(raw.get("backoff_s", 1))
        self.backoff_max_s = float(raw.get("backoff_max_s", 30))
        self.times: list[float] = []  # monotonic times of the restarts within the window
        self.delays: list[float] = []  # every delay waited, in order (one per restart)

    @classmethod
    def of(cls, spec: dict) -> "Restart | None":
        """The policy of SPEC, or None (no "restart" key: never restart)."""
        raw = spec.get("restart")
        return cls(raw) if isinstance(raw, dict) else None

    def next_delay(self, now: float) -> "float | None":
        """The delay before the next restart, or None: `max` restarts already within window."""
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.max:
            return None
        return min(self.backoff_s * (2 ** len(self.times)), self.backoff_max_s)

    def allow(self, now: float, delay: float) -> None:
        """Count a restart decided at NOW that waits DELAY first."""
        self.times.append(now)
        self.delays.append(delay)


class Stopper:
    """SIGTERM/SIGINT/SIGHUP: a stop. Forwarded once to the running server; ends a backoff."""

    def __init__(self) -> None:
        self.requested = False
        self.proc = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)

    def install(self) -> None:
        """Handle the stop signals from now on."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        # A group kill (killpg, systemd) reaches the server too: forward once, for a stop
        # aimed at the supervisor alone.
        if self.requested:
            return
        self.requested = True
        try:
            os.write(self._w, b"x")
        except OSError:
            pass
        self.forward()

    def forward(self) -> None:
        """SIGTERM the running server (after a stop that came while it was being started)."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def sleep(self, delay: float) -> bool:
        """Wait DELAY s; False when a stop came (at once, not at the end of the delay)."""
        end = time.monotonic() + delay
        while not self.requested and time.monotonic() < end:
            try:
                select.select([self._r], [], [], max(0.0, end - time.monotonic()))
            except InterruptedError:
                pass
        return not self.requested


def _open_log(paths: Paths, spec: dict):
    """Forget the previous run's exit record and stop marker, rotate the log, open a new one."""
    for path in (paths.exit, paths.stop_marker):
        try:
            os.unlink(path)
        except OSError:
            pass
    if os.path.exists(paths.log):
        os.replace(paths.log, paths.log + ".1")
    fd = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    log = os.fdopen(fd, "ab", buffering=0)
    for d in spec.get("mkdirs") or []:
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as exc:
            log.write((f"orchestrator-supervisor: cannot create {d}: {exc}\n").encode())
    return log


#: a line that says why a program failed: a Python exception, a CUDA/NCCL/OOM error
_ERROR_LINE = re.compile(r"(\w+(Error|Exception)\b|error:|CUDA error|NCCL|out of memory|"
                         r"Aborted|Segmentation fault)", re.IGNORECASE)
HISTORY = 5


def cause_of(tail: "list[str]", code: "int | None", sig: "int | None") -> str:
    """Why the server exited: killed by a signal (named), else the last error line it printed
    (a Python exception's last line, a CUDA error), else its last line, else its exit code."""
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {sig} ({name})"
    lines = [t.strip() for t in tail if t.strip()
             and not t.startswith("orchestrator-supervisor")]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line[:300]
    return lines[-1][:300] if lines else f"exit code {code}"


def pump(fd: int, log, masker: Masker, tail: "list | None" = None) -> None:
    """Copy the server's output from FD to LOG, masked, until it closes; the last lines
    written (masked) are kept in TAIL."""
    rest = b""
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], 1.0)
        except InterruptedError:
            continue
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        out = masker.feed(chunk)
        log.write(out)
        rest = _keep_tail(tail, rest + out)
    held = masker.flush()
    log.write(held)
    _keep_tail(tail, rest + held + b"\n")


def _keep_tail(tail: "list | None", data: bytes) -> bytes:
    """Append the complete lines of DATA to TAIL (the last 40); return the incomplete rest."""
    if tail is None:
        return b""
    *lines, rest = data.split(b"\n")
    tail.extend(x.decode("utf-8", "replace") for x in lines)
    del tail[:-40]
    return rest[-4096:]


class Supervisor:
    """One launch spec supervised: start, pump, record, and restart per its policy."""

    def __init__(self, spec_path: str, spec: dict) -> None:
        self.spec = spec
        self.paths = Paths(spec_path, spec)
        self.restart = Restart.of(spec)
        self.stopper = Stopper()
        self.env = dict(os.environ)
        self.env.update(spec.get("env") or {})
        self.env["PYTHONUNBUFFERED"] = "1"
        self.log = None
        self.exits = []  # type: list[dict]  # the last HISTORY exits: at, code, signal, cause

    def stop_requested(self) -> bool:
        """A signal came, or server_stop wrote its marker."""
        return self.stopper.requested or os.path.exists(self.paths.stop_marker)

    def start(self) -> "subprocess.Popen | None":
        """The server started (its pid record written), or None (exit record 127 written)."""
        argv = self.spec["argv"]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=self.env,
                                    cwd=self.spec.get("cwd") or self.paths.state,
                                    close_fds=True)
        except OSError as exc:
            self.log.write((f"orchestrator-supervisor: cannot start {argv[0]}: {exc}\n")
                           .encode())
            write_json(self.paths.exit, {"pid": None, "code": CANNOT_START, "signal": None,
                                         "at": time.time(), "error": str(exc)})
            return None
        spec = self.spec
        write_json(self.paths.pid, {
            "pid": proc.pid, "pgid": os.getpgid(0), "supervisor_pid": os.getpid(),
            "starttime": starttime(proc.pid), "started_at": time.time(), "boot_id": boot_id(),
            "fingerprint": spec.get("fingerprint"), "log": self.paths.log,
            "launch": self.paths.spec, "managed_by": spec.get("managed_by"),
            "unit": spec.get("unit"), "restarts": len(self.restart.delays) if self.restart else 0,
            "restart": spec.get("restart"), "exits": self.exits,
        })
        self.stopper.proc = proc
        if self.stopper.requested:
            self.stopper.forward()
        return proc

    def record(self, proc: subprocess.Popen, rc: int, tail: "list | None" = None,
               **extra: object) -> None:
        """The exit record of PROC (exit status RC, last output lines TAIL) and its log line."""
        code = rc if rc >= 0 else None
        sig = -rc if rc < 0 else None
        stopped = self.stop_requested()
        cause = cause_of(tail or [], code, sig)
        how = f"code {code}" if code is not None else cause.replace("killed by ", "")
        note = " (stop requested)" if stopped else ""
        if tail is not None and not stopped and rc != 0:
            self.exits = (self.exits + [{"at": time.time(), "code": code, "signal": sig,
                                         "cause": cause}])[-HISTORY:]
            note += f": {cause}" if code is not None else ""
        if extra.get("restarting"):
            note += (f"; restarting in {extra['restart_in_s']:g}s (restart "
                     f"{len(self.restart.delays)} of at most {self.restart.max} within "
                     f"{self.restart.window_s:g}s)")
        elif extra.get("gave_up"):
            note += f"; gave up: {extra['reason']}"
        self.log.write((f"orchestrator-supervisor: server pid {proc.pid} exited with "
                        f"{how}{note}\n").encode())
        rec = {"pid": proc.pid, "code": code, "signal": sig, "at": time.time(),
               "stop_requested": stopped, "restarting": False, "gave_up": False,
               "cause": cause, "exits": self.exits}
        if self.restart is not None:
            rec.update(restarts=len(self.restart.delays), delays_s=list(self.restart.delays))
        rec.update(extra)
        write_json(self.paths.exit, rec)

    def main(self) -> int:
        """Supervise until the server ends for good; the supervisor's exit status."""
        self.stopper.install()
        self.log = _open_log(self.paths, self.spec)
        while True:
            proc = self.start()
            if proc is None:
                return CANNOT_START
            tail = []  # type: list[str]
            pump(proc.stdout.fileno(), self.log, Masker(*read_keys(self.spec)), tail)
            rc = proc.wait()
            if rc == 0 or self.stop_requested() or self.restart is None:
                self.record(proc, rc, tail)
                return 0 if rc == 0 or self.stop_requested() else 1
            now = time.monotonic()
            delay = self.restart.next_delay(now)
            if delay is None:
                r = self.restart
                self.record(proc, rc, tail, gave_up=True,
                            reason=f"{len(r.times)} restarts within {r.window_s:g}s (restart "
                            f"max {r.max}, window_s {r.window_s:g}); last exit: "
                            f"{cause_of(tail, rc if rc >= 0 else None, -rc if rc < 0 else None)}")
                return GAVE_UP
            self.restart.allow(now, delay)
            self.record(proc, rc, tail, restarting=True, restart_in_s=delay)
            if not self.stopper.sleep(delay) or self.stop_requested():
                self.record(proc, rc)  # the stop ends the wait: no restart
                return 0


def main(argv: "list | None" = None) -> int:
    """Supervise the server of the launch spec ARGV[0] (default: sys.argv[1])."""
    spec_path = (argv if argv is not None else sys.argv[1:])[0]
    with open(spec_path) as fh:
        spec = json.load(fh)
    return Supervisor(spec_path, spec).main()


if __name__ == "__main__":
    sys.exit(main())
