"""The server supervisor: run a server, mask the API key in its log, record its exit.

A stand-alone program (stdlib only, Python 3.8+; it imports nothing of the package): the action
`server_start` (orchestrator.remote.actions) and the sglang_server stage write its text to
STATE_DIR/supervise.py, and it runs as `PYTHON STATE_DIR/supervise.py STATE_DIR/launch.json` (by
the agent with setsid, or by systemd). It is the session leader: the server and everything it
spawns share its process group, so one killpg() stops them all. It forwards SIGTERM to the
server, masks the API key before a byte reaches the log, and writes the pid and exit records.

It also holds the two /proc readers the other host modules share (`boot_id`, `starttime`): it
must carry its own, so they live here once.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

MASK = b"***"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


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
    """Replaces KEY by MASK in a byte stream cut into chunks anywhere (even inside the key)."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.hold = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of CHUNK that can be written now, masked."""
        buf = self.hold + chunk
        if not self.key:
            self.hold = b""
            return buf
        buf = buf.replace(self.key, MASK)
        buf, self.hold = split_hold(buf, self.key)
        return buf

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


class Maskers:
    """One Masker per key, chained (the spec's `key_file` and every one of its `key_files`)."""

    def __init__(self, keys: "list[bytes]") -> None:
        self.maskers = [Masker(k) for k in keys if k]

    def feed(self, chunk: bytes) -> bytes:
        """CHUNK through every masker."""
        for m in self.maskers:
            chunk = m.feed(chunk)
        return chunk

    def flush(self) -> bytes:
        """What every masker still holds, masked by the ones after it."""
        out = b""
        for i, m in enumerate(self.maskers):
            out = m.feed(out) + m.flush() if i else m.flush()
        return out


def _read_keys(spec: dict) -> "list[bytes]":
    keys = []
    for path in [spec.get("key_file"), *(spec.get("key_files") or [])]:
        if not path:
            continue
        try:
            with open(path, "rb") as fh:
                keys.append(fh.read().strip())
        except OSError:
            pass
    return keys


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


def _forward_signals(proc: subprocess.Popen) -> None:
    forwarded = []

    def forward(signum, frame) -> None:
        # A group kill (killpg, systemd) reaches the server too: forward once, for a stop
        # aimed at the supervisor alone.
        if forwarded:
            return
        forwarded.append(signum)
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)


def pump(fd: int, log, masker: "Masker | Maskers") -> None:
    """Copy the server's output from FD to LOG, masked, until it closes."""
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
        log.write(masker.feed(chunk))
    log.write(masker.flush())


def _record_exit(paths: Paths, proc: subprocess.Popen, rc: int, log) -> int:
    code = rc if rc >= 0 else None
    sig = -rc if rc < 0 else None
    stopped = os.path.exists(paths.stop_marker)
    how = f"code {code}" if code is not None else f"signal {sig}"
    note = " (stop requested)" if stopped else ""
    log.write(f"orchestrator-supervisor: server pid {proc.pid} exited with {how}{note}\n".encode())
    write_json(paths.exit, {"pid": proc.pid, "code": code, "signal": sig, "at": time.time(),
                            "stop_requested": stopped})
    return 0 if code == 0 else 1


def main(argv: "list | None" = None) -> int:
    """Supervise the server of the launch spec ARGV[0] (default: sys.argv[1])."""
    spec_path = (argv if argv is not None else sys.argv[1:])[0]
    with open(spec_path) as fh:
        spec = json.load(fh)
    paths = Paths(spec_path, spec)
    keys = _read_keys(spec)
    log = _open_log(paths, spec)
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    env["PYTHONUNBUFFERED"] = "1"
    argv = spec["argv"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env,
                                cwd=spec.get("cwd") or paths.state, close_fds=True)
    except OSError as exc:
        log.write((f"orchestrator-supervisor: cannot start {argv[0]}: {exc}\n").encode())
        write_json(paths.exit, {"pid": None, "code": 127, "signal": None, "at": time.time(),
                                "error": str(exc)})
        return 127
    write_json(paths.pid, {
        "pid": proc.pid, "pgid": os.getpgid(0), "supervisor_pid": os.getpid(),
        "starttime": starttime(proc.pid), "started_at": time.time(), "boot_id": boot_id(),
        "fingerprint": spec.get("fingerprint"), "log": paths.log, "launch": spec_path,
        "managed_by": spec.get("managed_by"), "unit": spec.get("unit"),
    })
    _forward_signals(proc)
    pump(proc.stdout.fileno(), log, Maskers(keys))
    return _record_exit(paths, proc, proc.wait(), log)


if __name__ == "__main__":
    sys.exit(main())
