"""Client side of the agent protocol, shared by `SSHTransport` and `LocalTransport`.

`AgentSession` drives one running agent (`orchestrator.remote.agent`) over a byte pipe: it ships
the agent source and modules, then multiplexes requests (each with an id) over the one channel.
A reader thread parses frames and hands them to per-request queues, so a caller waiting for a
command can be interrupted (Ctrl-C) without corrupting the stream, and `kill_all()` / `close()`
may be called from another thread.

Liveness: while a request is in flight the agent sends a heartbeat every `heartbeat` seconds. If
nothing at all arrives for `dead_after` seconds the session declares the connection lost and
closes it, so a vanished host never hangs a caller.

`AgentTransport` is the transport interface and the part both implementations share:
reconnect-on-demand, error mapping of agent answers, retry of idempotent file/probe requests after
a reconnect. Transports translate paramiko/socket errors once, into `orchestrator.errors`.
"""

from __future__ import annotations

import codecs
import itertools
import json
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import suppress
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.errors import (
    CommandTimeout,
    ConnectError,
    ConnectionLost,
    OrchestratorError,
    TransientConnectError,
    TransportError,
)
from orchestrator.logs import get_logger
from orchestrator.remote import agent as agent_mod
from orchestrator.remote import bootstrap
from orchestrator.remote import source as remote_source
from orchestrator.result import Result

if TYPE_CHECKING:  # the pydantic models: not imported on the way to the first connection
    from orchestrator.config.model import HostSpec

log = get_logger(__name__)

#: Called with ("stdout"|"stderr", text) as output arrives, for live progress views.
OutputCallback = Callable[[str, str], None]

FRAME = agent_mod.FRAME
MAGIC = agent_mod.MAGIC
#: the program given to `python3 -c` (orchestrator/remote/bootstrap.py)
BOOTSTRAP = remote_source("bootstrap")
_REMOTE_DIR = Path(agent_mod.__file__).parent


@cache
def agent_source() -> bytes:
    """The agent program shipped to hosts (the text of orchestrator/remote/agent.py)."""
    return (_REMOTE_DIR / "agent.py").read_bytes()


@cache
def shipped_modules() -> tuple[tuple[str, str], ...]:
    """Modules shipped with the agent: probes first, then every other module of remote/.

    The agent makes them importable by name in any order (agent.ShippedModules); programs that
    run under another python (the supervisor, the CUDA init check) travel with them so that
    actions and probes find their text on the host (probes.module_source).
    """
    names = sorted({p.stem for p in _REMOTE_DIR.glob("*.py")} - {"__init__", "agent"},
                   key=lambda name: (name != "probes", name))
    return tuple((n, (_REMOTE_DIR / f"{n}.py").read_text(encoding="utf-8")) for n in names)


class PipeClosed(Exception):
    """The byte pipe to the agent is gone (internal; becomes ConnectionLost)."""


class Pipe(Protocol):
    """A bidirectional byte stream to a running agent process."""

    def send(self, data: bytes) -> None:
        """Send all of `data`; raise PipeClosed when the pipe is gone."""

    def recv(self, n: int) -> bytes:
        """Block for up to `n` bytes; b"" at EOF."""

    def close(self, wait: float) -> None:
        """Send EOF, give the agent `wait` seconds to exit, then tear everything down."""

    def exit_status(self) -> int | None:
        """The agent process's exit status once known."""

    def stderr_tail(self) -> str:
        """The last few KB the agent process wrote to stderr."""


_DEAD = object()
_PULSE = agent_mod.pack({"op": "hb"})


class _Output:
    """A command's stdout (fd 1) and stderr (fd 2) as they arrive: kept whole for the Result,
    and passed on decoded (UTF-8, split characters kept for the next chunk) to a live view."""

    NAMES = {1: "stdout", 2: "stderr"}

    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.chunks: dict[int, list[bytes]] = {1: [], 2: []}
        self.decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in (1, 2)}

    def add(self, fd: int, body: bytes) -> None:
        self.chunks[fd].append(body)
        if self.on_output is not None:
            text = self.decoders[fd].decode(body)
            if text:
                self.on_output(self.NAMES[fd], text)

    def finish(self) -> None:
        """Pass on what the decoders still hold (an incomplete character at the very end)."""
        if self.on_output is not None:
            for fd in (1, 2):
                tail = self.decoders[fd].decode(b"", final=True)
                if tail:
                    self.on_output(self.NAMES[fd], tail)

    def text(self, fd: int) -> str:
        return b"".join(self.chunks[fd]).decode("utf-8", "replace")


class _Reader:
    """The reader thread of a session: skips what the host prints before the agent's MAGIC
    (kept as `preamble`), then parses frames and hands each to `deliver`; at EOF or on a broken
    stream it calls `end` with the reason."""

    def __init__(self, pipe: Pipe, host: str, deliver: Callable[[dict, bytes], None],
                 end: Callable[[str], None]) -> None:
        self.pipe = pipe
        self.host = host
        self.deliver = deliver
        self.end = end
        self.last_seen = time.monotonic()
        #: text the host printed before the agent started (e.g. from a login shell's rc file)
        self.preamble = b""
        self.thread = threading.Thread(target=self._loop, name=f"agent-reader-{host}",
                                       daemon=True)

    def _loop(self) -> None:
        buf = bytearray()
        reason = "the connection closed"
        synced = False
        try:
            while True:
                chunk = self.pipe.recv(262144)
                if not chunk:
                    status = self.pipe.exit_status()
                    if status is not None:
                        reason = f"the agent exited with status {status}"
                    if not synced:
                        self.preamble = bytes(buf[-4000:])
                    break
                self.last_seen = time.monotonic()
                buf += chunk
                if not synced:
                    at = buf.find(MAGIC)
                    if at < 0:
                        if len(buf) > 1 << 20:
                            self.preamble = bytes(buf[-4000:])
                            reason = "the host sent 1 MiB of text instead of starting the agent"
                            break
                        continue
                    self.preamble = bytes(buf[:at])
                    if self.preamble:
                        log.debug("text before the agent started", host=self.host,
                                  text=self.preamble[-500:].decode("utf-8", "replace"))
                    del buf[: at + len(MAGIC)]
                    synced = True
                pos = 0
                while len(buf) - pos >= FRAME.size:
                    hlen, blen = FRAME.unpack_from(buf, pos)
                    end = pos + FRAME.size + hlen + blen
                    if len(buf) < end:
                        break
                    header = json.loads(bytes(buf[pos + FRAME.size : pos + FRAME.size + hlen]))
                    body = bytes(buf[pos + FRAME.size + hlen : end])
                    pos = end
                    self.deliver(header, body)
                if pos:
                    del buf[:pos]
        except Exception as exc:  # noqa: BLE001 - any failure here means the stream is unusable
            reason = f"reading from the agent failed: {type(exc).__name__}: {exc}"
        self.end(reason)


def _startup_error(pipe: Pipe, reader: _Reader, host: str) -> TransportError:
    """Why the agent did not start: what the host's side said and its exit status, after the
    channel closed before the agent's hello."""
    reader.thread.join(2.0)  # let it collect what the host printed before EOF
    deadline = time.monotonic() + 2.0
    status = pipe.exit_status()
    while status is None and time.monotonic() < deadline:
        time.sleep(0.02)
        status = pipe.exit_status()
    err = pipe.stderr_tail().strip()
    out = reader.preamble.decode("utf-8", "replace").strip()
    said = f": {err[-800:]}" if err else ""
    if out:
        said += f" (it printed: {out[-300:]!r})"
    if status == 127 or "python3: not found" in err or "command not found" in err:
        return ConnectError(
            f"could not start the agent: python3 was not found on the host{said}",
            host=host,
            hint="install Python 3.8 or newer on the host (e.g. `apt-get install python3`)",
        )
    if status == bootstrap.EXIT_OLD_PYTHON:
        return ConnectError(
            f"could not start the agent{said}", host=host,
            hint="install Python 3.8 or newer on the host as `python3`",
        )
    if status is not None:
        # the remote side ran and failed (login shell refused, agent crashed, ...):
        # trying again will not help
        return ConnectError(
            f"the agent could not start on the host (exit status {status}){said}",
            host=host,
            hint="check the account's login shell and its rc files (they must not exit or "
            "read stdin in non-interactive sessions); a Python traceback here is a bug in "
            "orchestrator: please report it",
        )
    return TransientConnectError(
        f"the connection closed while the agent was starting{said}", host=host
    )


def _remote_error(header: dict, what: str, host: str) -> TransportError:
    """The error an agent's `error` answer to WHAT means."""
    kind = header.get("kind")
    message = header.get("message") or "unknown error"
    if kind == "become":
        return TransportError(
            message, host=host,
            hint="become needs root: passwordless sudo for the SSH user, or log in as root",
        )
    if kind == "exception" and header.get("traceback"):
        log.debug("agent error", host=host, what=what, traceback=header["traceback"])
    return TransportError(f"{what} failed on the host: {message}", host=host)


def _result(command: str, done: dict, out: _Output, timeout: float | None,
            host: str) -> Result:
    """The Result of a command from its `done` frame; CommandTimeout when it timed out."""
    result = Result(command=command, exit_code=int(done["exit"]), stdout=out.text(1),
                    stderr=out.text(2), duration=float(done.get("duration") or 0.0), host=host,
                    timed_out=bool(done.get("timed_out")),
                    extra={k: done.get(k) for k in ("signal", "killed", "pid") if done.get(k)})
    if result.timed_out:
        raise CommandTimeout(f"command timed out after {timeout:g}s and its process group was "
                             f"killed: {command}", host=host, result=result)
    return result


class AgentSession:
    """One running agent and the framed protocol to it. Thread-safe."""

    def __init__(
        self,
        pipe: Pipe,
        *,
        host: str,
        heartbeat: float = 5.0,
        dead_after: float = 30.0,
        kill_grace: float = 2.0,
        become_mode: str = "auto",
        become_password: str | None = None,
        read_only: bool = False,
    ) -> None:
        self._pipe = pipe
        self.host = host
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        self.kill_grace = kill_grace
        self._become_mode = become_mode
        self._become_password = become_password
        self._read_only = read_only
        self._ids = itertools.count(1)
        self._queues: dict[int | str, queue.SimpleQueue] = {}
        self._qlock = threading.Lock()
        self._send_lock = threading.Lock()
        self._last_sent = time.monotonic()
        self._dead: str | None = None
        self._closed = False
        self.hello: dict[str, Any] = {}
        self._reader = _Reader(pipe, host, self._dispatch, self._mark_dead)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float) -> dict[str, Any]:
        """Ship the agent, wait for its hello; raise ConnectError subclasses on failure."""
        init: dict[str, Any] = {
            "op": "init",
            "heartbeat": self.heartbeat,
            "grace": self.kill_grace,
            # the agent kills our commands if we stay silent this long while they run
            "client_timeout": 2 * self.dead_after,
            "become": self._become_mode,
            "modules": [list(m) for m in shipped_modules()],
            # a dry run: the agent writes nothing for itself (no code cache)
            "read_only": self._read_only,
        }
        if self._become_password:
            init["become_password"] = self._become_password
        hello_q = self._register("hello")
        self._reader.thread.start()
        try:
            self._send_raw(agent_mod.encode_source(agent_source()) + agent_mod.pack(init))
            try:
                item = hello_q.get(timeout=timeout)
            except queue.Empty:
                self.close(wait=False)
                raise TransientConnectError(
                    f"the agent did not start within {timeout:g}s (python3 on the host is slow "
                    "or the connection stalled)",
                    host=self.host,
                ) from None
        except PipeClosed:
            item = _DEAD
        finally:
            self._unregister("hello")
        if item is _DEAD:
            error = _startup_error(self._pipe, self._reader, self.host)
            self.close(wait=False)
            raise error
        self.hello = item[0]
        return self.hello

    @property
    def alive(self) -> bool:
        """True while the channel is open and the agent answers."""
        return self._dead is None

    def close(self, wait: bool = True) -> None:
        """EOF to the agent (it kills what still runs), wait a little for it, tear down."""
        if self._closed:
            return
        self._closed = True
        grace = self.kill_grace + 2.0 if (wait and self.alive) else 0.0
        self._mark_dead("the connection was closed")  # sends refuse; waiters wake up
        locked = self._send_lock.acquire(timeout=5.0)  # never close under a running send
        try:
            self._pipe.close(grace)
        except Exception:  # pragma: no cover - teardown must not raise
            log.debug("agent pipe close failed", host=self.host, exc_info=True)
        finally:
            if locked:
                self._send_lock.release()

    # ---- I/O -------------------------------------------------------------------------------
    def _send_raw(self, data: bytes) -> None:
        with self._send_lock:
            if self._dead is not None:
                raise PipeClosed(self._dead)
            self._pipe.send(data)
            self._last_sent = time.monotonic()

    def _send_quietly(self, data: bytes, wait: float) -> bool:
        """Send DATA while the channel is up, waiting up to WAIT seconds for a send that runs;
        never raises (best effort). False when that send kept the channel."""
        if not self._send_lock.acquire(timeout=wait):
            return False
        try:
            with suppress(Exception):
                if self._dead is None:
                    self._pipe.send(data)
                    self._last_sent = time.monotonic()
        finally:
            self._send_lock.release()
        return True

    def _pulse(self) -> None:
        """Tell the agent we are still here (sent while waiting; skipped if a send runs)."""
        if time.monotonic() - self._last_sent >= self.heartbeat:
            self._send_quietly(_PULSE, 0)

    def _register(self, rid: int | str) -> queue.SimpleQueue:
        q: queue.SimpleQueue = queue.SimpleQueue()
        with self._qlock:
            self._queues[rid] = q
            if self._dead is not None:
                q.put(_DEAD)
        return q

    def _unregister(self, rid: int | str) -> None:
        with self._qlock:
            self._queues.pop(rid, None)

    def _mark_dead(self, reason: str) -> None:
        with self._qlock:
            if self._dead is None:
                self._dead = reason
            for q in self._queues.values():
                q.put(_DEAD)

    def _dispatch(self, header: dict, body: bytes) -> None:
        kind = header.get("t")
        if kind == "hb":
            return
        key = "hello" if kind == "hello" else header.get("id")
        with self._qlock:
            q = self._queues.get(key)
        if q is not None:
            q.put((header, body))

    def _next(self, q: queue.SimpleQueue, since: float, what: str) -> tuple[dict, bytes]:
        poll = min(1.0, max(0.05, self.heartbeat / 2))
        while True:
            self._pulse()
            try:
                item = q.get(timeout=poll)
            except queue.Empty:
                silent = time.monotonic() - max(self._reader.last_seen, since)
                if silent > self.dead_after:
                    reason = (
                        f"no message from the host for {silent:.0f}s (the agent sends a "
                        f"heartbeat every {self.heartbeat:g}s): the host or network vanished"
                    )
                    self._mark_dead(reason)
                    self.close(wait=False)
                    raise self._lost(what) from None
                continue
            if item is _DEAD:
                raise self._lost(what)
            return item

    def _lost(self, what: str) -> ConnectionLost:
        return ConnectionLost(f"connection lost during {what}: {self._dead}",
                              host=self.host)

    # ---- requests ----------------------------------------------------------------------------
    def call(self, op: str, fields: Mapping[str, Any], body: bytes = b"") -> tuple[dict, bytes]:
        """Send one request and wait for its result/error frame."""
        rid = next(self._ids)
        q = self._register(rid)
        what = f"{op} {fields.get('path') or fields.get('name') or ''}".strip()
        try:
            since = time.monotonic()
            try:
                self._send_raw(agent_mod.pack({"op": op, "id": rid, **fields}, body))
            except PipeClosed:
                raise self._lost(what) from None
            header, rbody = self._next(q, since, what)
        finally:
            self._unregister(rid)
        if header.get("t") == "error":
            raise _remote_error(header, what, self.host)
        return header, rbody

    def send_kill(self, rid: int | None = None) -> None:
        """Ask the agent to kill one command (or all with rid=None). Never raises or hangs.

        If the send lock stays busy (e.g. called from a signal handler that interrupted a
        send on this very thread) the request is dropped: close() still kills everything.
        """
        header = {"op": "kill_all"} if rid is None else {"op": "kill", "target": rid}
        if not self._send_quietly(agent_mod.pack(header), 2.0):
            log.debug("kill request not sent: channel busy", host=self.host)

    def run(self, command: str, timeout: float | None, stdin: bytes | None,
            on_output: OutputCallback | None, **fields: Any) -> Result:
        """Run one command through the agent (`fields`: its env, cwd and become); see
        `AgentTransport.run`."""
        rid = next(self._ids)
        q = self._register(rid)
        header = {"op": "run", "id": rid, "cmd": command, "timeout": timeout,
                  "stdin": stdin is not None, **fields}
        out = _Output(on_output)
        done: dict | None = None
        what = f"command `{command}`"
        try:
            since = time.monotonic()
            try:
                self._send_raw(agent_mod.pack(header, stdin or b""))
            except PipeClosed:
                raise self._lost(what) from None
            while done is None:
                frame, body = self._next(q, since, what)
                kind = frame.get("t")
                if kind == "out":
                    out.add(2 if frame.get("fd") == 2 else 1, body)
                elif kind in ("done", "error"):
                    done = frame
                    if kind == "error":
                        raise _remote_error(frame, what, self.host)
        except BaseException as exc:
            if done is None and self.alive and not isinstance(exc, ConnectionLost):
                self.send_kill(rid)  # Ctrl-C or a failing callback: stop the command first
            raise
        finally:
            self._unregister(rid)
        out.finish()
        return _result(command, done, out, timeout, self.host)


class AgentTransport(ABC):
    """One connection to one host, to its agent through an `AgentSession` (reconnecting on
    demand). Subclasses implement `_open_session()` (one connection attempt). Several threads
    may call `run` at once (requests are multiplexed); `kill_all()` and `close()` are safe from
    any thread.
    """

    #: a dry run's connection: the agent writes nothing for itself (make_transport sets it)
    read_only = False
    #: called (on the calling thread) after a dropped connection was re-opened on demand, before
    #: the request that needed it is sent; what it raises fails that request. The runner re-takes
    #: the host's deploy lock here: the lock lives with the connection.
    on_reconnect: Callable[[], None] | None = None

    def __init__(
        self,
        spec: HostSpec,
        *,
        heartbeat: float = 5.0,
        heartbeat_misses: int = 6,
        kill_grace: float = 2.0,
        become_mode: str = "auto",
    ) -> None:
        self.spec = spec
        self.name = spec.name or spec.address or "localhost"
        self.heartbeat = heartbeat
        self.dead_after = heartbeat * heartbeat_misses
        self.kill_grace = kill_grace
        self.become_mode = become_mode
        self._session: AgentSession | None = None
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._closed = False  # close() was called; only an explicit connect() reopens
        self._in_hook = False  # on_reconnect / the retire of a dropped agent is running
        self._dropped: dict[str, Any] | None = None  # hello of the agent of a dropped session

    # ---- to implement ---------------------------------------------------------------------
    @abstractmethod
    def _open_session(self) -> AgentSession:
        """Make one connection attempt and return a started session (or raise our errors)."""

    def _new_session(self, pipe: Pipe) -> AgentSession:
        return AgentSession(
            pipe, host=self.name, heartbeat=self.heartbeat, dead_after=self.dead_after,
            kill_grace=self.kill_grace, become_mode=self.become_mode,
            become_password=self.spec.become_password, read_only=self.read_only,
        )

    # ---- shared ------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True while a live agent session exists."""
        s = self._session
        return s is not None and s.alive

    @property
    def agent_info(self) -> dict[str, Any]:
        """The agent's hello (pid, uid, user, python, probes, actions) of the current session."""
        s = self._session
        return dict(s.hello) if s is not None else {}

    def connect(self, budget: float | None = None) -> None:
        """Start the agent (`_start`: one attempt; SSHTransport retries transient failures
        within `budget` seconds). AuthError / HostKeyError at once; TransientConnectError when
        the budget runs out."""
        with self._lock:
            if self.connected:
                return
            self._closing.clear()
            self._closed = False
            self._drop_session()
            self._session = self._start(budget)

    def _start(self, budget: float | None) -> AgentSession:
        return self._open_session()

    def _drop_session(self) -> None:
        s, self._session = self._session, None
        if s is not None:
            if s.hello.get("pid"):
                self._dropped = dict(s.hello)  # it may live on at the host: see _ensure
            s.close(wait=False)

    def _ensure(self) -> AgentSession:
        with self._lock:
            s = self._session
            fresh = False
            if s is None or not s.alive:
                if self._closed:
                    raise TransportError(
                        "the connection was closed (after close(), only connect() reopens it)",
                        host=self.name,
                    )
                self.connect(self.spec.connect_budget)
                fresh = True
            if not self._in_hook and (fresh or self._dropped is not None):
                self._in_hook = True  # their own requests may reconnect again: no recursion
                try:
                    if self._dropped is not None:
                        self._retire_dropped()
                    if fresh and self.on_reconnect is not None:
                        self.on_reconnect()
                finally:
                    self._in_hook = False
            assert self._session is not None  # the requests above may have reconnected
            return self._session

    def _retire_dropped(self) -> None:
        """End the agent of the dropped session if it still runs, before anything else is sent.

        Its command may still run at the host (the agent gives up on a silent client only after
        client_timeout): a stage's retry must not run beside it. Best effort: a host that
        rebooted, or an agent already gone, is simply reported as not running.
        """
        old, self._dropped = self._dropped, None
        assert old is not None
        if old.get("pid") == self.agent_info.get("pid") or not old.get("starttime"):
            return
        try:
            res = self.act("agent_retire", pid=old["pid"], starttime=old["starttime"],
                             boot_id=old.get("boot_id"), wait=self.kill_grace + 5.0)
        except OrchestratorError as exc:
            log.warning("could not end the agent of the dropped connection", host=self.name,
                        pid=old["pid"], error=exc.message)
            return
        if res.get("was_running"):
            log.info("transport.agent_retired", host=self.name,
                     pid=old["pid"], exited=res.get("exited"), seconds=res.get("seconds"),
                     error=res.get("error"))

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        become: bool = False,
        on_output: OutputCallback | None = None,
    ) -> Result:
        """Run `command` with /bin/sh -c on the host; never raises on a non-zero exit.

        `env` values travel over the channel, never on argv. On timeout the command's whole
        process group is killed and CommandTimeout is raised. A dropped connection raises
        ConnectionLost (the command is not re-run here: retries are the stage's business).
        """
        session = self._ensure()
        try:
            return session.run(command, timeout, stdin, on_output, env=dict(env or {}), cwd=cwd,
                               become=bool(become))
        except ConnectionLost as exc:
            log.warning("connection lost", host=self.name, error=exc.message)
            with self._lock:
                if self._session is session:
                    self._drop_session()
            raise

    def _call(self, op: str, fields: Mapping[str, Any], body: bytes = b"") -> tuple[dict, bytes]:
        # file, probe and action requests are idempotent (an action repeated after a drop finds
        # its work done: server_start reports the server it started): reconnect, ask once more
        for attempt in (1, 2):
            session = self._ensure()
            try:
                return session.call(op, fields, body)
            except ConnectionLost as exc:
                with self._lock:
                    if self._session is session:
                        self._drop_session()
                if attempt == 2 or self._closing.is_set():
                    raise
                log.warning("connection lost, retrying", host=self.name, op=op, error=exc.message)
        raise AssertionError("unreachable")  # pragma: no cover

    def read_file(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        header, body = self._call("read_file", {"path": path})
        return None if header.get("value") is None else body

    def write_file(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write atomically (temp file + fsync + rename), creating parent directories."""
        self._call("write_file", {"path": path, "mode": mode}, bytes(data))

    def probe(self, name: str, /, **args: Any) -> Any:
        """The JSON answer of the named read-only probe (`orchestrator.remote.probes`)."""
        if name in self._ensure().hello.get("actions", ()):
            raise TransportError(
                f"{name!r} changes the host: it is an action, sent with act(), never as a probe",
                host=self.name,
            )
        header, _ = self._call("probe", {"name": name, "args": args})
        return header.get("value")

    def act(self, name: str, /, **args: Any) -> Any:
        """The JSON answer of the named action (`orchestrator.remote.actions`: it changes the
        host). No cancellation check here: `Host.act` refuses after Ctrl-C."""
        header, _ = self._call("act", {"name": name, "args": args})
        return header.get("value")

    def module_errors(self) -> dict[str, str]:
        """Import every shipped module on the host now (the agent imports each only when one
        of its probes or actions is first called); the import errors by module, {} when all
        load on the host's Python."""
        header, _ = self._call("load_all", {})
        return header["value"]

    def kill_all(self) -> None:
        """Stop every remote command this transport started (used on Ctrl-C)."""
        s = self._session
        if s is not None and s.alive:
            s.send_kill(None)

    def close(self) -> None:
        """Close the connection; the agent kills every command still running."""
        self._closed = True
        self._closing.set()
        s, self._session = self._session, None
        if s is not None:
            s.close(wait=True)

    def __enter__(self) -> AgentTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
