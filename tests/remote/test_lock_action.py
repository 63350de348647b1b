"""The agent's deploy-lock action (orchestrator.remote.actions.lock_acquire): a lock taken by
another process is reported with its holder's record, also when asked in the moment between
the holder's flock and its record being written."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

from orchestrator.remote import actions


def test_a_holder_caught_before_it_wrote_its_record_is_still_named(tmp_path: Path) -> None:
    lock = tmp_path / "deploy.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another deploy took the lock and has not written yet
    record = {"run_id": "intruder", "user": "eve"}
    writer = threading.Timer(0.2, lambda: os.write(fd, json.dumps(record).encode()))
    writer.start()
    try:
        res = actions.lock_acquire(str(lock), owner={"run_id": "mine"})
        assert res == {"acquired": False, "holder": record, "path": str(lock)}
        os.ftruncate(fd, 0)  # it releases (emptied, then unlocked a moment later)
        threading.Timer(0.2, lambda: fcntl.flock(fd, fcntl.LOCK_UN)).start()
        res = actions.lock_acquire(str(lock), owner={"run_id": "mine"})
        assert res["acquired"] and res["previous"] is None
        assert json.loads(lock.read_text())["run_id"] == "mine"
    finally:
        writer.join()
        actions.lock_release(str(lock))
        os.close(fd)


def test_a_holder_that_never_writes_a_record_is_reported_unnamed(tmp_path: Path) -> None:
    lock = tmp_path / "deploy.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # e.g. `flock deploy.lock sleep 600` by hand
    try:
        res = actions.lock_acquire(str(lock))
        assert res == {"acquired": False, "holder": None, "path": str(lock)}
    finally:
        os.close(fd)
