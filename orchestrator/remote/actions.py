"""Actions: everything the agent does that changes the host (stdlib only, Python 3.8+).

Registered with `@action` (orchestrator.remote.probes): the client sends them with
`transport.act(name, ...)`, stages with `Host.act`, which refuses once the run is cancelled
(Ctrl-C). The agent never serves them as probes, and the other modules of this folder only read.

    server_start    start the supervisor (orchestrator.remote.supervisor, written to
                    STATE_DIR/supervise.py) in its own session; returns its pid file
    server_stop     SIGTERM the server's process group, wait a grace period, SIGKILL
    process_stop    the same for a foreign pid (a stale server holding our port)
    lock_acquire    take the per-host deploy lock (a flock held by this agent process)
    lock_release    release it
    agent_retire    end the agent of a dropped connection (and so what it still runs)

The deploy lock: `lock_acquire` takes an exclusive flock on a file (default
~/.orchestrator/deploy.lock) and keeps the descriptor open for the life of the agent, i.e. of the
connection. The file holds the holder's run id, user, operator host and start time, so a refused
deploy can say who holds it. When a run dies (Ctrl-C, crash, lost connection, host reboot) its
agent exits and the kernel releases the flock: the next deploy takes the lock over safely and
reports the dead holder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import threading
import time

from orchestrator.remote.probes import action, module_source
from orchestrator.remote.server import (
    SUPERVISOR_FILE,
    cmdline,
    group_alive,
    live_in_group,
    load_json,
    pgrp,
    pid_alive,
    process_view,
    read_bytes,
    state_paths,
    tail_lines,
)
from orchestrator.remote.supervisor import boot_id as read_boot_id
from orchestrator.remote.supervisor import starttime as starttime_of

# ---------------------------------------------------------------------------- server


def _reap(proc) -> None:
    try:
        proc.wait()
    except Exception:  # noqa: BLE001 - reaping only
        pass


@action("server_start")
def server_start(state_dir: str, python: str, wait: float = 10.0) -> dict:
    """Start `PYTHON STATE_DIR/supervise.py STATE_DIR/launch.json` in a new session.

    Returns the pid file the supervisor writes once the server process exists, or
    {"error": ..., "log_tail": [...]} when the supervisor died first.

    A request repeated while the supervisor of the previous one still runs starts nothing: the
    agent client re-sends an action whose connection dropped before the answer came back, and a
    second server would fight the first for the port and the GPUs. It reports the running one
    ("repeated": true). A legitimate start always follows the stop of the previous server.
    """
    p = state_paths(state_dir)
    starting = os.path.join(p["dir"], "supervisor.start")
    prev = load_json(starting)
    if isinstance(prev, dict) and prev.get("supervisor_pid"):
        sup = int(prev["supervisor_pid"])
        if pid_alive(sup) and starttime_of(sup) == prev.get("starttime") and \
                prev.get("boot_id") == read_boot_id():
            return _await_server(p, sup, None, wait, repeated=True)
    sup_path = os.path.join(p["dir"], SUPERVISOR_FILE)
    tmp = sup_path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(module_source("supervisor"))
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
        json.dump({"supervisor_pid": proc.pid, "starttime": starttime_of(proc.pid),
                   "boot_id": read_boot_id()}, fh)
    os.replace(tmp, starting)
    return _await_server(p, proc.pid, proc, wait)


def _await_server(p: dict, sup: int, proc, wait: float, repeated: bool = False) -> dict:
    """Wait for supervisor SUP to record its server in the pid file (proc: ours to reap/kill)."""
    err_path = os.path.join(p["dir"], "supervisor.err")
    deadline = time.monotonic() + float(wait)
    while True:
        info = load_json(p["pid"])
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
            return {"error": why, "stderr": "\n".join(tail_lines(err_path, 20)),
                    "log_tail": tail_lines(p["log"], 30)}
        time.sleep(0.02)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(kill, alive, grace: float, members=None) -> dict:
    """KILL(SIGTERM), wait up to GRACE s while ALIVE(), then (noting MEMBERS(): what ignored
    the SIGTERM) KILL(SIGKILL) and wait up to 10 s more."""
    t0 = time.monotonic()
    kill(signal.SIGTERM)
    while time.monotonic() - t0 < float(grace) and alive():
        time.sleep(0.05)
    out = {"forced": alive()}
    if out["forced"]:
        if members is not None:
            out["holdouts"] = members()
        kill(signal.SIGKILL)
        end = time.monotonic() + 10.0
        while time.monotonic() < end and alive():
            time.sleep(0.05)
    out.update(waited_s=round(time.monotonic() - t0, 2), stopped=not alive())
    return out


def _stop_group(pgid: int, pid: int, grace: float) -> dict:
    return _stop(lambda sig: _signal_group(pgid, sig),
                 lambda: pid_alive(pid) or group_alive(pgid), grace,
                 lambda: _group_members(pgid))


def _group_members(pgid: int) -> list:
    """The live processes of group PGID as [{pid, comm, state, wchan}]: what ignored a SIGTERM."""
    members = []
    for pid, state in live_in_group(pgid):
        comm = read_bytes(f"/proc/{pid}/comm") or b""
        wchan = read_bytes(f"/proc/{pid}/wchan") or b""
        members.append({"pid": pid, "comm": comm.decode("utf-8", "replace").strip(),
                        "state": state, "wchan": wchan.decode("utf-8", "replace")})
    return members


@action("server_stop")
def server_stop(state_dir: str, grace: float = 60.0) -> dict:
    """Stop the recorded server: SIGTERM its process group, wait GRACE s, then SIGKILL."""
    p = state_paths(state_dir)
    pidfile = load_json(p["pid"])
    proc = process_view(pidfile)
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


@action("process_stop")
def process_stop(pid: int, grace: float = 30.0, starttime_ticks=None) -> dict:
    """Stop a process we did not start (a stale server): its group when it leads one."""
    pid = int(pid)
    if not pid_alive(pid):
        return {"pid": pid, "was_running": False, "stopped": True, "forced": False}
    if starttime_ticks is not None and starttime_of(pid) != starttime_ticks:
        return {"pid": pid, "was_running": False, "stopped": False, "forced": False,
                "error": f"pid {pid} is now a different process; nothing was signalled"}
    argv = cmdline(pid)
    pgid = pgrp(pid)
    if pgid == pid and pgid != os.getpgid(0):
        res = _stop_group(pgid, pid, grace)
    else:
        def kill(sig: int) -> None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

        res = _stop(kill, lambda: pid_alive(pid), grace)
    res.update({"pid": pid, "was_running": True, "cmdline": argv})
    return res


# ---------------------------------------------------------------------------- deploy lock

_HELD = {}  # type: dict  # lock path -> descriptor held by this agent
#: how long a taken lock whose record is still empty is asked again (see lock_acquire)
HOLDER_WAIT_S = 1.0


def _read_lock(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, 0)
        data = os.read(fd, 65536)
        return json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None


@action("lock_acquire")
def lock_acquire(path: str = "~/.orchestrator/deploy.lock", owner: dict | None = None) -> dict:
    """Take the lock for `owner` (a dict); report the current holder when it is taken.

    A holder writes its record right after it takes the flock (below), and lock_release empties
    the record just before it unlocks: a taken lock with an empty record is in one of those
    two moments, so it is asked again for up to HOLDER_WAIT_S until it is either free or has
    a record to name (an operator told "another deploy holds it" is told whose)."""
    path = os.path.expanduser(path)
    if path in _HELD:
        return {"acquired": True, "held_here": True, "path": path}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            holder = _read_lock(fd)
            if holder is not None or time.monotonic() >= deadline:
                os.close(fd)
                return {"acquired": False, "holder": holder, "path": path}
            time.sleep(0.02)
    previous = _read_lock(fd)
    record = dict(owner or {})
    record.update(agent_pid=os.getpid(), acquired_at=time.time())
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, 0)
    # No fsync: the flock is the lock, and it does not outlive the host's kernel. The record
    # only names the holder, to a deploy that asks while it is held (it reads the page
    # cache) or, as "previous", to the next holder after one that died without releasing.
    # A host that lost power may come back with an empty record: that next deploy then says
    # nothing of a take-over, where the reboot is told anyway (the boot id). An fsync here
    # waited 1-44 ms per host (16 hosts at once on one disk) before any check could start.
    os.write(fd, json.dumps(record).encode("utf-8"))
    _HELD[path] = fd
    return {"acquired": True, "previous": previous, "path": path}


@action("lock_release")
def lock_release(path: str = "~/.orchestrator/deploy.lock") -> dict:
    """Release the lock if this agent holds it (the file is emptied first)."""
    path = os.path.expanduser(path)
    fd = _HELD.pop(path, None)
    if fd is None:
        return {"released": False}
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return {"released": True}


@action("agent_retire")
def agent_retire(pid: int, starttime: int, boot_id: str | None, wait: float = 10.0) -> dict:
    """End the agent of a dropped connection if it still runs (pid + start time + boot id).

    Over a real network a dropped client can leave its agent running for a while (sshd has
    not noticed; the agent gives up on a silent client only after its client_timeout), and with
    it the command that was cut: a retried `pip install` would run beside the first one. SIGTERM
    makes that agent kill its commands' process groups, release its locks and exit (SIGCONT
    wakes it should it be stopped). Waits up to `wait` seconds for it to be gone.
    """
    pid = int(pid)

    def same() -> bool:
        return pid_alive(pid) and starttime_of(pid) == starttime

    if (pid == os.getpid() or not starttime or not boot_id or read_boot_id() != boot_id
            or not same()):
        return {"was_running": False}
    t0 = time.monotonic()
    try:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return {"was_running": False}
    except PermissionError as exc:
        return {"was_running": True, "exited": False, "error": str(exc)}
    while same() and time.monotonic() - t0 < float(wait):
        time.sleep(0.02)
    return {"was_running": True, "exited": not same(), "seconds": round(time.monotonic() - t0, 3)}
