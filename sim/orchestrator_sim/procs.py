"""Find and end the processes of simulated hosts.

Every command a simulated host runs carries ``SIM_HOST_ID=<dir-hash>:<host>`` in its environment;
scanning ``/proc/*/environ`` finds them all, including daemons that called setsid() and were
re-parented to init. Only processes that carry the marker (or descend from a process the
simulator started) are ever signalled.
"""

from __future__ import annotations

import os
import signal
import time

MARKER = "SIM_HOST_ID"


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def marked(value: str | None = None, prefix: str | None = None) -> list[int]:
    """Pids whose environment has SIM_HOST_ID == value (or starting with prefix)."""
    me = os.getpid()
    want = f"{MARKER}=".encode()
    out = []
    for pid in _pids():
        if pid == me:
            continue
        for item in _environ(pid).split(b"\0"):
            if not item.startswith(want):
                continue
            v = item[len(want):].decode("utf-8", "replace")
            if (value is not None and v == value) or (prefix is not None and v.startswith(prefix)):
                out.append(pid)
            break
    return _with_descendants(out)


def _with_descendants(pids: list[int]) -> list[int]:
    """PIDS and every process below them. A program may rewrite its own environment block: the
    real sglang-router calls setproctitle("sglang::router") (sglang_router/launch_router.py:32
    in 0.3.2), which reuses the argv+environ memory, so /proc/PID/environ no longer shows the
    marker; it is still the child of a marked supervisor."""
    if not pids:
        return pids
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    out, seen, todo = list(pids), set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def _ppid_map() -> dict[int, int]:
    out = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data.rsplit(b")", 1)[-1].split()
        if len(fields) >= 2:
            out[pid] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    parents = _ppid_map()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_marked(value: str | None = None, prefix: str | None = None,
                timeout: float = 5.0) -> int:
    """SIGKILL every marked process until none is left (new children included); return count."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in marked(value, prefix) if alive(p)]
        if not pids:
            return len(killed)
        kill_pids(pids)
        killed.update(pids)
        if time.monotonic() > deadline:
            return len(killed)
        time.sleep(0.02)


def kill_tree(root: int, timeout: float = 5.0) -> None:
    """SIGKILL a process and all its descendants."""
    deadline = time.monotonic() + timeout
    pids = [root] + descendants(root)
    while True:
        kill_pids([p for p in pids if alive(p)])
        pids = [p for p in pids if alive(p)]
        if not pids or time.monotonic() > deadline:
            return
        time.sleep(0.02)
