"""On-host helpers for a long-running server process (stdlib only, Python 3.8+).

Probes shipped with the agent (see `orchestrator.remote.probes`):

    http            one HTTP request with urllib (no proxies): status, headers, body; a refused
                    connection is reported as error "connection refused", never raised
    server_start    start the SUPERVISOR below in its own session (setsid); returns its pid file
    server_status   pid file + liveness (not a recycled pid: start time compared), exit record,
                    who listens on host:port (ours or not), /health, fingerprint, log tail
    server_stop     SIGTERM the server's process group, wait a grace period, SIGKILL
    process_stop    the same for a foreign pid (a stale server holding our port)
    log_tail        the last lines of a log file
    log_read        bytes of a log file from an offset (for `logs -f`), rotation aware
    systemd         whether systemd runs this host (PID 1) and systemctl exists

Files in the state dir (written by the stage and the supervisor):

    launch.json     what to run: argv, env, log path, key file (0600)
    server.pid      JSON: pid, pgid, supervisor_pid, starttime (clock ticks since boot),
                    started_at (epoch), boot_id, fingerprint
    server.exit     JSON written by the supervisor when the server exits: code or signal
    server.log      stdout+stderr of the server (the previous run's log is server.log.1);
                    the API key is masked before a byte reaches the file
    stop_requested  marker written by server_stop (so a stop is not reported as a crash)

The supervisor is the session leader: the server and everything it spawns share its process
group, so one killpg() stops them all. It forwards SIGTERM to the server, masks the API key in
the log, and records the exit code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from orchestrator.remote.probes import probe

PID_FILE = "server.pid"
EXIT_FILE = "server.exit"
LOG_FILE = "server.log"
LAUNCH_FILE = "launch.json"
STOP_MARKER = "stop_requested"
SUPERVISOR_FILE = "supervise.py"

#: The supervisor program, written to STATE_DIR/supervise.py and run as
#: `PYTHON STATE_DIR/supervise.py STATE_DIR/launch.json` (by us with setsid, or by systemd).
SUPERVISOR = r'''"""orchestrator supervisor: run a server, mask the API key, record its exit."""
import json
import os
import select
import signal
import subprocess
import sys
import time

MASK = b"***"


def _atomic(path, obj):
    tmp = path + ".tmp.%d" % os.getpid()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _starttime(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _split_hold(buf, key):
    """(emit, hold): hold is the longest tail of buf that may be the start of the key."""
    for k in range(min(len(key) - 1, len(buf)), 0, -1):
        if buf.endswith(key[:k]):
            return buf[:-k], buf[-k:]
    return buf, b""


def main():
    spec_path = sys.argv[1]
    with open(spec_path) as fh:
        spec = json.load(fh)
    state = os.path.dirname(os.path.abspath(spec_path))
    log_path = spec["log"]
    pid_path = spec.get("pid_file") or os.path.join(state, "server.pid")
    exit_path = spec.get("exit_file") or os.path.join(state, "server.exit")
    stop_marker = os.path.join(state, "stop_requested")
    key = b""
    if spec.get("key_file"):
        try:
            with open(spec["key_file"], "rb") as fh:
                key = fh.read().strip()
        except OSError:
            key = b""
    for path in (exit_path, stop_marker):
        try:
            os.unlink(path)
        except OSError:
            pass
    if os.path.exists(log_path):
        os.replace(log_path, log_path + ".1")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    log = os.fdopen(fd, "ab", buffering=0)
    for d in spec.get("mkdirs") or []:
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as exc:
            log.write(("orchestrator-supervisor: cannot create %s: %s\n" % (d, exc)).encode())
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    env["PYTHONUNBUFFERED"] = "1"
    argv = spec["argv"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=spec.get("cwd") or state,
                                close_fds=True)
    except OSError as exc:
        log.write(("orchestrator-supervisor: cannot start %s: %s\n" % (argv[0], exc)).encode())
        _atomic(exit_path, {"pid": None, "code": 127, "signal": None, "at": time.time(),
                            "error": str(exc)})
        return 127
    _atomic(pid_path, {
        "pid": proc.pid, "pgid": os.getpgid(0), "supervisor_pid": os.getpid(),
        "starttime": _starttime(proc.pid), "started_at": time.time(), "boot_id": _boot_id(),
        "fingerprint": spec.get("fingerprint"), "log": log_path, "launch": spec_path,
        "managed_by": spec.get("managed_by"), "unit": spec.get("unit"),
    })
    forwarded = []

    def forward(signum, frame):
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
    out = proc.stdout.fileno()
    hold = b""
    while True:
        try:
            ready, _, _ = select.select([out], [], [], 1.0)
        except InterruptedError:
            continue
        if not ready:
            continue
        try:
            chunk = os.read(out, 65536)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf = hold + chunk
        if key:
            buf = buf.replace(key, MASK)
            buf, hold = _split_hold(buf, key)
        log.write(buf)
    if hold:
        log.write(hold)
    rc = proc.wait()
    code = rc if rc >= 0 else None
    sig = -rc if rc < 0 else None
    stopped = os.path.exists(stop_marker)
    log.write(("orchestrator-supervisor: server pid %d exited with %s%s\n" % (
        proc.pid, "code %d" % code if code is not None else "signal %d" % sig,
        " (stop requested)" if stopped else "")).encode())
    _atomic(exit_path, {"pid": proc.pid, "code": code, "signal": sig, "at": time.time(),
                        "stop_requested": stopped})
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
'''


# ---------------------------------------------------------------------------- /proc helpers


def _read(path: str, limit: int = 1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _stat_fields(pid: int):
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, ...] or None."""
    data = _read(f"/proc/{int(pid)}/stat")
    if not data:
        return None
    try:
        return data.rsplit(b")", 1)[1].split()
    except IndexError:
        return None


def pid_alive(pid) -> bool:
    """True when PID exists and is not a zombie."""
    if not pid:
        return False
    fields = _stat_fields(int(pid))
    return bool(fields) and fields[0] not in (b"Z", b"X")


def starttime(pid):
    """Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat_fields(int(pid))
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def cmdline(pid) -> list:
    """The argv of PID (empty when unreadable)."""
    data = _read(f"/proc/{int(pid)}/cmdline")
    if not data:
        return []
    return [p.decode("utf-8", "replace") for p in data.rstrip(b"\0").split(b"\0")]


def _pgrp(pid: int):
    fields = _stat_fields(pid)
    try:
        return int(fields[2]) if fields else None
    except (IndexError, ValueError):
        return None


def _all_pids() -> list:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def _live_in_group(pgid: int):
    """Yield (pid, state) of each live (non-zombie) process in process group PGID."""
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields and len(fields) > 2 and fields[0] not in (b"Z", b"X"):
            try:
                if int(fields[2]) == pgid:
                    yield pid, fields[0].decode()
            except ValueError:
                continue


def group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in process group PGID."""
    return any(True for _ in _live_in_group(pgid))


def _boot_id():
    data = _read("/proc/sys/kernel/random/boot_id")
    return data.decode().strip() if data else None


def _load_json(path: str):
    data = _read(path)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


def _hex_ipv4(text: str) -> str:
    raw = bytes.fromhex(text)
    return socket.inet_ntop(socket.AF_INET, raw[::-1])


def _hex_ipv6(text: str) -> str:
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening_sockets(port: int) -> list:
    """LISTEN sockets on PORT: [{"address", "inode"}] from /proc/net/tcp and tcp6."""
    out = []
    for name, conv in (("/proc/net/tcp", _hex_ipv4), ("/proc/net/tcp6", _hex_ipv6)):
        data = _read(name, 64 << 20)
        if not data:
            continue
        for line in data.decode("ascii", "replace").splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "0A":
                continue
            addr, _, hexport = parts[1].partition(":")
            try:
                if int(hexport, 16) != int(port):
                    continue
                out.append({"address": conv(addr), "inode": int(parts[9])})
            except ValueError:
                continue
    return out


def _address_matches(bound: str, wanted) -> bool:
    if not wanted or wanted in ("0.0.0.0", "::"):
        return True
    if bound in ("0.0.0.0", "::", wanted):
        return True
    return bound.startswith("::ffff:") and bound[7:] == wanted


def socket_owners(inodes, candidates=None) -> dict:
    """{inode: pid} for sockets held by processes (CANDIDATES first, then every process)."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    found = {}
    seen = set()
    for group in (list(candidates or []), None):
        pids = group if group is not None else _all_pids()
        for pid in pids:
            if pid in seen:
                continue
            seen.add(pid)
            fd_dir = f"/proc/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd_dir + "/" + fd)
                except OSError:
                    continue
                if target in wanted and wanted[target] not in found:
                    found[wanted[target]] = pid
            if len(found) == len(wanted):
                return found
    return found


def _group_pids(pgid) -> list:
    return [pid for pid, _ in _live_in_group(int(pgid))] if pgid else []


def port_listener(host, port, ours_pgid=None) -> dict | None:
    """Who listens on host:port: {"pid", "cmdline", "address", "ours"} or None when free."""
    socks = [s for s in listening_sockets(port) if _address_matches(s["address"], host)]
    if not socks:
        return None
    owners = socket_owners([s["inode"] for s in socks], _group_pids(ours_pgid))
    sock = socks[0]
    pid = None
    for s in socks:
        if s["inode"] in owners:
            sock, pid = s, owners[s["inode"]]
            break
    return {
        "pid": pid,
        "cmdline": cmdline(pid) if pid else [],
        "address": sock["address"],
        "ours": bool(pid and ours_pgid and _pgrp(pid) == ours_pgid),
    }


# ---------------------------------------------------------------------------- http


def _no_proxy_opener():
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _error_text(exc) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(reason, ConnectionResetError):
        return "connection reset"
    name = type(reason).__name__
    if name == "RemoteDisconnected":
        return "connection closed by the server"
    return f"{name}: {reason}"


@probe("http")
def http(url: str, method: str = "GET", headers=None, body=None, timeout: float = 10.0,
         max_bytes: int = 4 << 20) -> dict:
    """One HTTP request; never raises for HTTP or connection errors.

    Returns {"status": int | None, "headers": {...}, "body": text, "error": None | "connection
    refused" | "timed out" | ..., "elapsed": seconds}.
    """
    import urllib.error
    import urllib.request

    data = None
    if body is not None:
        data = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None and not req.has_header("Content-type"):
        req.add_header("Content-Type", "application/json")
    t0 = time.monotonic()
    out = {"status": None, "headers": {}, "body": "", "error": None}
    try:
        with _no_proxy_opener().open(req, timeout=float(timeout)) as resp:
            out["status"] = resp.status
            out["headers"] = dict(resp.headers.items())
            out["body"] = resp.read(max_bytes).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        out["status"] = exc.code
        out["headers"] = dict(exc.headers.items()) if exc.headers else {}
        try:
            out["body"] = exc.read(max_bytes).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - the status is what matters
            out["body"] = ""
    except Exception as exc:  # noqa: BLE001 - reported as data, never raised
        out["error"] = _error_text(exc)
    out["elapsed"] = round(time.monotonic() - t0, 4)
    return out


# ---------------------------------------------------------------------------- logs


def _tail(path: str, lines: int, max_bytes: int = 256 * 1024, complete: bool = False):
    """(the last LINES lines, the offset just after them, the file's inode); with COMPLETE, a
    last line still being written (no newline yet) is left out, for the next read."""
    try:
        with open(path, "rb") as fh:
            inode = os.fstat(fh.fileno()).st_ino
            fh.seek(0, 2)
            start = max(0, fh.tell() - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return [], 0, None
    end = data.rfind(b"\n") + 1 if complete else len(data)
    text = data[:end].decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    got = [ln for ln in text.split("\n") if ln.strip()]
    return (got[-int(lines):] if lines > 0 else []), start + end, inode


def _tail_lines(path: str, lines: int, max_bytes: int = 256 * 1024) -> list:
    return _tail(path, lines, max_bytes)[0]


@probe("log_tail")
def log_tail(path: str, lines: int = 50, complete: bool = False) -> dict:
    """The last LINES non-empty lines of PATH (progress bars' \\r updates count as lines).

    "offset" and "inode" say where they end: with COMPLETE (only whole lines), `log_read` from
    there misses no line and repeats none (logs -f).
    """
    exists = os.path.exists(path)
    got, offset, inode = _tail(path, lines, complete=complete) if exists else ([], 0, None)
    return {"path": path, "exists": exists, "lines": got, "offset": offset, "inode": inode}


@probe("log_read")
def log_read(path: str, offset: int = 0, inode=None, max_bytes: int = 1 << 20,
             from_end: bool = False) -> dict:
    """Bytes of PATH from OFFSET (restarting at 0 when the file was rotated or truncated).

    With FROM_END, no data: just the current end offset and inode (where following starts).
    """
    try:
        st = os.stat(path)
    except OSError:
        return {"exists": False, "data": "", "offset": 0, "inode": None, "rotated": False}
    if from_end:
        return {"exists": True, "data": "", "offset": st.st_size, "inode": st.st_ino,
                "rotated": False}
    rotated = inode is not None and st.st_ino != inode
    if rotated or st.st_size < offset:
        offset = 0
        rotated = True
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(max_bytes)
    return {"exists": True, "data": data.decode("utf-8", "replace"),
            "offset": offset + len(data), "inode": st.st_ino, "rotated": rotated}


# ---------------------------------------------------------------------------- status


def _state_paths(state_dir: str) -> dict:
    d = os.path.abspath(os.path.expanduser(state_dir))
    return {
        "dir": d, "pid": os.path.join(d, PID_FILE), "exit": os.path.join(d, EXIT_FILE),
        "log": os.path.join(d, LOG_FILE), "launch": os.path.join(d, LAUNCH_FILE),
        "stop": os.path.join(d, STOP_MARKER), "fingerprint": os.path.join(d, "fingerprint.json"),
    }


def _process_view(pidfile) -> dict:
    """Liveness of the recorded server: alive and the very process we started?"""
    out = {"pid": None, "alive": False, "same_process": False, "supervisor_alive": False,
           "cmdline": [], "uptime_s": None}
    if not isinstance(pidfile, dict) or not pidfile.get("pid"):
        return out
    pid = int(pidfile["pid"])
    out["pid"] = pid
    out["alive"] = pid_alive(pid)
    boot = _boot_id()
    same_boot = not pidfile.get("boot_id") or not boot or pidfile.get("boot_id") == boot
    out["same_process"] = bool(out["alive"] and same_boot and pidfile.get("starttime") is not None
                               and starttime(pid) == pidfile.get("starttime"))
    if out["same_process"]:
        out["cmdline"] = cmdline(pid)
        if pidfile.get("started_at"):
            out["uptime_s"] = round(time.time() - float(pidfile["started_at"]), 1)
    sup = pidfile.get("supervisor_pid")
    out["supervisor_alive"] = bool(sup and pid_alive(sup) and same_boot)
    return out


@probe("server_status")
def server_status(state_dir: str, host=None, port=None, health_path: str = "/health",
                  health_timeout: float = 5.0, log_lines: int = 0) -> dict:
    """Everything `check()` needs about the server of STATE_DIR, in one round trip."""
    p = _state_paths(state_dir)
    pidfile = _load_json(p["pid"])
    proc = _process_view(pidfile)
    exit_rec = _load_json(p["exit"])
    if isinstance(exit_rec, dict) and isinstance(pidfile, dict) and exit_rec.get("pid") not in (
            None, pidfile.get("pid")):
        exit_rec = None  # an older run's exit record
    out = {
        "state_dir": p["dir"], "pidfile": pidfile, "process": proc, "exit": exit_rec,
        "stop_requested": os.path.exists(p["stop"]),
        "fingerprint": _load_json(p["fingerprint"]), "launch_exists": os.path.exists(p["launch"]),
        "log_path": p["log"], "listener": None, "health": None, "log_tail": [],
    }
    if port:
        ours = pidfile.get("pgid") if proc["same_process"] and isinstance(pidfile, dict) else None
        out["listener"] = port_listener(host, int(port), ours)
        if out["listener"] is not None and health_path:
            target = host if host and host not in ("0.0.0.0", "::") else "127.0.0.1"
            if ":" in target:
                target = "[" + target + "]"
            out["health"] = http(f"http://{target}:{int(port)}{health_path}",
                                 timeout=health_timeout)
    if log_lines:
        out["log_tail"] = _tail_lines(p["log"], log_lines)
    return out


# ---------------------------------------------------------------------------- start / stop


def _reap(proc) -> None:
    try:
        proc.wait()
    except Exception:  # noqa: BLE001 - reaping only
        pass


@probe("server_start")
def server_start(state_dir: str, python: str, wait: float = 10.0) -> dict:
    """Start `PYTHON STATE_DIR/supervise.py STATE_DIR/launch.json` in a new session.

    Returns the pid file the supervisor writes once the server process exists, or
    {"error": ..., "log_tail": [...]} when the supervisor died first.

    A request repeated while the supervisor of the previous one still runs starts nothing: the
    agent client re-sends a probe whose connection dropped before the answer came back, and a
    second server would fight the first for the port and the GPUs. It reports the running one
    ("repeated": true). A legitimate start always follows the stop of the previous server.
    """
    p = _state_paths(state_dir)
    starting = os.path.join(p["dir"], "supervisor.start")
    prev = _load_json(starting)
    if isinstance(prev, dict) and prev.get("supervisor_pid"):
        sup = int(prev["supervisor_pid"])
        if pid_alive(sup) and starttime(sup) == prev.get("starttime") and \
                prev.get("boot_id") == _boot_id():
            return _await_server(p, sup, None, wait, repeated=True)
    sup_path = os.path.join(p["dir"], SUPERVISOR_FILE)
    tmp = sup_path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(SUPERVISOR)
    os.chmod(tmp, 0o644)
    os.replace(tmp, sup_path)
    err_path = os.path.join(p["dir"], "supervisor.err")
    with open(err_path, "ab") as err_fh:
        proc = subprocess.Popen(
            [python, sup_path, p["launch"]], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err_fh, cwd=p["dir"], start_new_session=True,
            close_fds=True,
        )
    tmp = starting + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"supervisor_pid": proc.pid, "starttime": starttime(proc.pid),
                   "boot_id": _boot_id()}, fh)
    os.replace(tmp, starting)
    return _await_server(p, proc.pid, proc, wait)


def _await_server(p: dict, sup: int, proc, wait: float, repeated: bool = False) -> dict:
    """Wait for supervisor SUP to record its server in the pid file (proc: ours to reap/kill)."""
    err_path = os.path.join(p["dir"], "supervisor.err")
    deadline = time.monotonic() + float(wait)
    while True:
        info = _load_json(p["pid"])
        if isinstance(info, dict) and info.get("supervisor_pid") == sup:
            if proc is not None:
                threading.Thread(target=_reap, args=(proc,), daemon=True).start()
            out = {"pidfile": info, "supervisor_pid": sup}
            if repeated:
                out["repeated"] = True
            return out
        gone = proc.poll() is not None if proc is not None else not pid_alive(sup)
        if gone or time.monotonic() > deadline:
            late = not gone
            if late and proc is not None:
                os.killpg(proc.pid, signal.SIGKILL)
            if proc is not None:
                proc.wait()
            if late:
                why = f"the supervisor did not start the server within {float(wait):g}s"
            elif proc is not None:
                why = (f"the supervisor exited with code {proc.returncode} before starting "
                       "the server")
            else:
                why = "the supervisor exited before starting the server"
            return {"error": why, "stderr": "\n".join(_tail_lines(err_path, 20)),
                    "log_tail": _tail_lines(p["log"], 30)}
        time.sleep(0.02)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(pgid: int, pid: int, grace: float) -> dict:
    t0 = time.monotonic()
    _signal_group(pgid, signal.SIGTERM)
    forced = False
    deadline = t0 + float(grace)
    while time.monotonic() < deadline:
        if not pid_alive(pid) and not group_alive(pgid):
            break
        time.sleep(0.05)
    else:
        forced = True
        holdouts = _group_members(pgid)
        _signal_group(pgid, signal.SIGKILL)
        end = time.monotonic() + 10.0
        while time.monotonic() < end and (pid_alive(pid) or group_alive(pgid)):
            time.sleep(0.05)
    out = {"forced": forced, "waited_s": round(time.monotonic() - t0, 2),
           "stopped": not pid_alive(pid) and not group_alive(pgid)}
    if forced:
        out["holdouts"] = holdouts
    return out


def _group_members(pgid: int) -> list:
    """The live processes of group PGID as [{pid, comm, state, wchan}]: what ignored a SIGTERM."""
    members = []
    for pid, state in _live_in_group(pgid):
        comm = _read(f"/proc/{pid}/comm") or b""
        wchan = _read(f"/proc/{pid}/wchan") or b""
        members.append({"pid": pid, "comm": comm.decode("utf-8", "replace").strip(),
                        "state": state, "wchan": wchan.decode("utf-8", "replace")})
    return members


@probe("server_stop")
def server_stop(state_dir: str, grace: float = 60.0) -> dict:
    """Stop the recorded server: SIGTERM its process group, wait GRACE s, then SIGKILL."""
    p = _state_paths(state_dir)
    pidfile = _load_json(p["pid"])
    proc = _process_view(pidfile)
    if not proc["same_process"] and not proc["supervisor_alive"]:
        return {"was_running": False, "pid": proc["pid"], "stopped": True, "forced": False}
    with open(p["stop"], "w") as fh:
        fh.write(f"{time.time():f}\n")
    pgid = int(pidfile.get("pgid") or pidfile.get("supervisor_pid"))
    if pgid in (os.getpgid(0), 0, 1):
        return {"was_running": True, "pid": proc["pid"], "stopped": False, "forced": False,
                "error": f"refusing to signal process group {pgid} (the agent's own)"}
    res = _stop_group(pgid, int(pidfile["pid"]), grace)
    res.update({"was_running": True, "pid": proc["pid"]})
    return res


@probe("process_stop")
def process_stop(pid: int, grace: float = 30.0, starttime_ticks=None) -> dict:
    """Stop a process we did not start (a stale server): its group when it leads one."""
    pid = int(pid)
    if not pid_alive(pid):
        return {"pid": pid, "was_running": False, "stopped": True, "forced": False}
    if starttime_ticks is not None and starttime(pid) != starttime_ticks:
        return {"pid": pid, "was_running": False, "stopped": False, "forced": False,
                "error": f"pid {pid} is now a different process; nothing was signalled"}
    argv = cmdline(pid)
    pgid = _pgrp(pid)
    if pgid == pid and pgid != os.getpgid(0):
        res = _stop_group(pgid, pid, grace)
    else:
        t0 = time.monotonic()
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        forced = False
        while time.monotonic() - t0 < float(grace) and pid_alive(pid):
            time.sleep(0.05)
        if pid_alive(pid):
            forced = True
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            end = time.monotonic() + 10.0
            while time.monotonic() < end and pid_alive(pid):
                time.sleep(0.05)
        res = {"forced": forced, "waited_s": round(time.monotonic() - t0, 2),
               "stopped": not pid_alive(pid)}
    res.update({"pid": pid, "was_running": True, "cmdline": argv})
    return res


@probe("systemd")
def systemd_info() -> dict:
    """Whether systemd manages this host: PID 1 is systemd and systemctl is on PATH."""
    import shutil

    comm = _read("/proc/1/comm")
    return {
        "booted": os.path.isdir("/run/systemd/system"),
        "pid1": comm.decode().strip() if comm else None,
        "systemctl": shutil.which("systemctl"),
        "uid": os.getuid(),
        "python": sys.executable,
    }
