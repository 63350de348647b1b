"""The per-host deploy lock held by the agent process, the boot id, and the end of the agent of
a dropped connection (stdlib, Python 3.8+).

`lock_acquire` takes an exclusive flock on a file (default ~/.orchestrator/deploy.lock) and keeps
the descriptor open for the life of the agent, i.e. of the connection. The file holds the
holder's run id, user, operator host and start time, so a refused deploy can say who holds it.
When a run dies (Ctrl-C, crash, lost connection, host reboot) its agent exits and the kernel
releases the flock: the next deploy takes the lock over safely and reports the dead holder.
"""

import errno
import fcntl
import json
import os
import signal
import time

from orchestrator.remote.probes import probe

_HELD = {}  # type: dict


def _read(fd):
    try:
        os.lseek(fd, 0, 0)
        data = os.read(fd, 65536)
        return json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None


@probe("lock_acquire")
def lock_acquire(path="~/.orchestrator/deploy.lock", owner=None):
    """Take the lock for `owner` (a dict); report the current holder when it is taken."""
    path = os.path.expanduser(path)
    if path in _HELD:
        return {"acquired": True, "held_here": True, "path": path}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return {"acquired": False, "holder": holder, "path": path}
        raise
    previous = _read(fd)
    record = dict(owner or {})
    record.update(agent_pid=os.getpid(), acquired_at=time.time())
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, 0)
    os.write(fd, json.dumps(record).encode("utf-8"))
    os.fsync(fd)
    _HELD[path] = fd
    return {"acquired": True, "previous": previous, "path": path}


@probe("lock_release")
def lock_release(path="~/.orchestrator/deploy.lock"):
    """Release the lock if this agent holds it (the file is emptied first)."""
    path = os.path.expanduser(path)
    fd = _HELD.pop(path, None)
    if fd is None:
        return {"released": False}
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return {"released": True}


@probe("boot_id")
def boot_id(path="/proc/sys/kernel/random/boot_id"):
    """The kernel's boot id: changes at every boot, so a run can tell the host rebooted."""
    try:
        with open(path) as fh:
            return {"boot_id": fh.read().strip()}
    except OSError:
        return {"boot_id": None}


@probe("agent_retire")
def agent_retire(pid, starttime, boot_id, wait=10.0):
    """End the agent of a dropped connection if it still runs (pid + start time + boot id).

    Over a real network a dropped client can leave its agent running for a while (sshd has
    not noticed; the agent gives up on a silent client only after its client_timeout), and with
    it the command that was cut: a retried `pip install` would run beside the first one. SIGTERM
    makes that agent kill its commands' process groups, release its locks and exit (SIGCONT
    wakes it should it be stopped). Waits up to `wait` seconds for it to be gone.
    """
    from orchestrator.remote.server import _boot_id, pid_alive
    from orchestrator.remote.server import starttime as start_of

    pid = int(pid)

    def same() -> bool:
        return pid_alive(pid) and start_of(pid) == starttime

    if pid == os.getpid() or not starttime or not boot_id or _boot_id() != boot_id or not same():
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
