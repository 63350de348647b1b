"""LocalTransport: the same agent as over SSH, run as a local `python3` subprocess over pipes.

Used for `connection: local` hosts (the control machine itself) and the simulated host. Same
semantics as SSHTransport: commands in their own process group, timeouts kill the group, env
over the pipe (never argv), atomic writes, probes. The agent runs in its own session so a
terminal Ctrl-C reaches the orchestrator, which then calls `kill_all()` / `close()`.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from contextlib import suppress
from typing import TYPE_CHECKING

from orchestrator.errors import ConnectError
from orchestrator.transports.agent_client import BOOTSTRAP, AgentSession, AgentTransport, PipeClosed

if TYPE_CHECKING:  # the pydantic models: not imported on the way to the first connection
    from orchestrator.config.model import HostSpec


class _ProcessPipe:
    """Pipe over a local agent process's stdin/stdout (stderr drained into a small tail)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._in = proc.stdin.fileno()
        self._out = proc.stdout.fileno()
        self._err: collections.deque[bytes] = collections.deque(maxlen=64)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True,
                                            name=f"agent-stderr-{proc.pid}")
        self._err_thread.start()
        self._closed = False

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            while True:
                chunk = os.read(self.proc.stderr.fileno(), 4096)
                if not chunk:
                    return
                self._err.append(chunk)
        except OSError:
            return

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._in, view)
                view = view[n:]
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise PipeClosed(str(exc)) from None

    def recv(self, n: int) -> bytes:
        try:
            return os.read(self._out, n)
        except OSError:
            return b""

    def close(self, wait: float) -> None:
        if self._closed:
            return
        self._closed = True
        with suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # EOF: the agent kills what still runs, then exits
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err_thread.join(1.0)

    def exit_status(self) -> int | None:
        return self.proc.poll()

    def stderr_tail(self) -> str:
        if self.proc.poll() is not None:
            self._err_thread.join(1.0)  # the process is gone: its stderr is about to end
        return b"".join(self._err).decode("utf-8", "replace")[-4000:]


class LocalTransport(AgentTransport):
    """Runs the agent as a local subprocess; same behaviour as SSHTransport, no network."""

    def __init__(
        self,
        spec: HostSpec,
        *,
        python: str | None = None,
        heartbeat: float = 5.0,
        heartbeat_misses: int = 6,
        kill_grace: float = 2.0,
        become_mode: str = "auto",
        start_timeout: float = 30.0,
    ) -> None:
        super().__init__(spec, heartbeat=heartbeat, heartbeat_misses=heartbeat_misses,
                         kill_grace=kill_grace, become_mode=become_mode)
        if not spec.name:
            self.name = "localhost"
        #: interpreter that runs the agent (default: the one running the orchestrator)
        self.python = python or sys.executable or "python3"
        self.start_timeout = start_timeout

    def _open_session(self) -> AgentSession:
        try:
            proc = subprocess.Popen(
                [self.python, "-c", BOOTSTRAP],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                bufsize=0, close_fds=True, start_new_session=True,
            )
        except OSError as exc:
            raise ConnectError(
                f"cannot start the local agent with {self.python!r}: {exc.strerror or exc}",
                host=self.name, hint="make sure Python 3.8+ is installed and on PATH",
            ) from None
        session = self._new_session(_ProcessPipe(proc))
        session.start(timeout=self.start_timeout)
        return session
