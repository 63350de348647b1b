"""SSHTransport: the agent over one long-lived SSH exec channel (Fabric 3 / paramiko).

Fabric's `Connection` resolves the host through ssh_config (HostName, Port, User, IdentityFile,
ProxyJump -> a chain of gateway Connections). We open that chain ourselves so that every hop:
  - verifies its host key against known_hosts (Fabric would use AutoAddPolicy and never load
    known_hosts): "strict" refuses unknown keys, "accept-new" records them on first use, and a
    changed key is always refused;
  - has connect, banner, auth and channel timeouts, and TCP keepalive; the tunnel through a jump
    host and `exec_command` are bounded too (`open_session()` and friends can otherwise hang
    for an hour, fabric #2197).
Then one exec channel runs the agent; each command is a message on it (about a millisecond),
not a new SSH channel (about 150 ms).

paramiko/socket errors are translated here, once, into `orchestrator.errors`; none escapes.
paramiko's own logger gets a NullHandler and does not propagate, so its tracebacks never reach
the console (a CLI that wants them in a debug file can attach a handler to "paramiko").
"""

from __future__ import annotations

import base64
import collections
import hashlib
import inspect
import logging
import os
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko
from fabric import Config, Connection
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    ChannelException,
    IncompatiblePeer,
    NoValidConnectionsError,
    PasswordRequiredException,
    SSHException,
)
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from orchestrator.errors import (
    AuthError,
    ConnectError,
    HostKeyError,
    TransientConnectError,
    TransportError,
)
from orchestrator.logs import get_logger
from orchestrator.transports.agent_client import BOOTSTRAP, AgentSession, AgentTransport, PipeClosed

if TYPE_CHECKING:  # the pydantic models: not imported on the way to the first connection
    from orchestrator.config.model import HostSpec

log = get_logger(__name__)

_paramiko_log = logging.getLogger("paramiko")
if not any(isinstance(h, logging.NullHandler) for h in _paramiko_log.handlers):
    _paramiko_log.addHandler(logging.NullHandler())
_paramiko_log.propagate = False

#: on_wait(attempt, elapsed_seconds, error): called before each wait between connect attempts
WaitCallback = Callable[[int, float, BaseException], None]

_KNOWN_HOSTS_LOCK = threading.Lock()
_SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key ("SHA256:...")."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH names a host in known_hosts: `host`, or `[host]:port` off port 22."""
    return host if int(port) == 22 else f"[{host}]:{port}"


class _UnknownHostKey(Exception):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(name)
        self.name = name
        self.key = key


_PARSED_KNOWN_HOSTS: dict[str, tuple[tuple[int, int, int], paramiko.HostKeys]] = {}
_PARSED_LOCK = threading.Lock()


def _parsed_known_hosts(path: str) -> paramiko.HostKeys | None:
    """The known_hosts file at PATH, parsed once while it stays the same (size, mtime, inode),
    None when there is none. Parsing builds a key object per line (8 ms for 128 lines here),
    and every host of a run reads the same file; a key recorded by accept-new changes the file,
    so the next connection parses it again. The result is shared: only read it."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    # parsed under the lock: the run's first connections all start at once, and each parsing
    # the file itself cost them all (paramiko 5.1 HostKeys.load checks every line against the
    # ones before it: hostkeys.py:88-103)
    with _PARSED_LOCK:
        hit = _PARSED_KNOWN_HOSTS.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        parsed = paramiko.HostKeys(path)
        _PARSED_KNOWN_HOSTS[path] = (stamp, parsed)
    return parsed


def _known_hosts(spec: HostSpec) -> Path:
    return Path(os.path.expanduser(spec.known_hosts or "~/.ssh/known_hosts"))


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """strict: refuse unknown keys. accept-new: append them to the known_hosts file."""

    def __init__(self, policy: str, known_hosts: Path, host: str) -> None:
        self.policy = policy
        self.known_hosts = known_hosts
        self.host = host

    @classmethod
    def install(cls, conn: Connection, spec: HostSpec, host: str, role: str) -> None:
        """Hand CONN's client the keys known_hosts has for its host, and SPEC's policy for a
        key it does not know (HOST: the inventory's name; ROLE: "jump host" for a gateway)."""
        known = _known_hosts(spec)
        # paramiko names a host's keys "[host]:port" unless the port is 22, and uses the system
        # file's keys for a name when it has any, the user's only otherwise (paramiko 5.1
        # client.py:405-418); only this host's entries are handed to the client
        name = known_hosts_name(conn.host, conn.port)
        try:
            files = [_SYSTEM_KNOWN_HOSTS] if spec.known_hosts is None else []
            mine = conn.client.get_host_keys()
            for parsed in (_parsed_known_hosts(p) for p in [*files, str(known)]):
                keys = parsed.lookup(name) if parsed is not None else None
                if keys:
                    for key_type in keys:
                        mine.add(name, key_type, keys[key_type])
                    break
        except Exception as exc:  # noqa: BLE001 - unreadable / malformed file
            raise ConnectError(f"cannot read known_hosts file {known}: {exc}", host=host,
                               hint="fix or remove the malformed line") from None
        label = host if not role else f"{host} ({role} {conn.host})"
        conn.client.set_missing_host_key_policy(cls(spec.host_key_policy, known, label))

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if self.policy != "accept-new":
            raise _UnknownHostKey(hostname, key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        try:
            with _KNOWN_HOSTS_LOCK:
                self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    if os.fstat(fd).st_size:
                        with open(self.known_hosts, "rb") as fh:
                            fh.seek(-1, os.SEEK_END)
                            if fh.read(1) != b"\n":
                                line = "\n" + line
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
        except OSError as exc:
            raise HostKeyError(
                f"cannot record the new host key of {hostname} in {self.known_hosts}: "
                f"{exc.strerror or exc}",
                host=self.host, hint="make the known_hosts file writable, or set `known_hosts:`",
            ) from None
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("recorded new host key", host=self.host, name=hostname,
                    key_type=key.get_name(), fingerprint=fingerprint(key),
                    known_hosts=str(self.known_hosts))


class _ChannelPipe:
    """Pipe over a paramiko exec channel; owns the chain of Connections behind it."""

    def __init__(self, chan: paramiko.Channel, chain: list[Connection], stall: float) -> None:
        self.chan = chan
        self.chain = chain
        self.stall = stall
        self._err: collections.deque[bytes] = collections.deque(maxlen=64)
        self._closed = False
        chan.settimeout(0.5)

    def _drain_stderr(self) -> None:
        try:
            while self.chan.recv_stderr_ready():
                data = self.chan.recv_stderr(4096)
                if not data:
                    return
                self._err.append(data)
        except Exception:  # noqa: BLE001 - diagnostics only
            return

    def send(self, data: bytes) -> None:
        off = 0
        progress = time.monotonic()
        while off < len(data):
            if self._closed:
                raise PipeClosed("closed")
            try:
                n = self.chan.send(data[off : off + 32768])
            except TimeoutError:
                if time.monotonic() - progress > self.stall:
                    raise PipeClosed(f"sending stalled for {self.stall:g}s") from None
                continue
            except (OSError, EOFError, SSHException) as exc:
                raise PipeClosed(str(exc)) from None
            if n <= 0:
                raise PipeClosed("the channel is closed")
            off += n
            progress = time.monotonic()

    def recv(self, n: int) -> bytes:
        while True:
            try:
                data = self.chan.recv(n)
            except TimeoutError:
                self._drain_stderr()
                if self._closed:
                    return b""
                continue
            except Exception:  # noqa: BLE001 - any channel failure is an EOF for the reader
                return b""
            if not data:
                self._drain_stderr()
            return data

    def close(self, wait: float) -> None:
        self._closed = True
        if wait > 0:
            with suppress(Exception):
                self.chan.shutdown_write()  # EOF to the agent: it kills what runs and exits
                self.chan.status_event.wait(wait)
        self._drain_stderr()
        for closer in [self.chan.close, *(c.client.close for c in self.chain)]:
            with suppress(Exception):  # teardown
                closer()

    def exit_status(self) -> int | None:
        # paramiko reports -1 for a channel that closed without an exit status: the
        # connection was cut, nothing on the host exited
        if not self.chan.exit_status_ready() or self.chan.exit_status == -1:
            return None
        return self.chan.exit_status

    def stderr_tail(self) -> str:
        self._drain_stderr()
        return b"".join(self._err).decode("utf-8", "replace")[-4000:]


def _backoff(initial: float, maximum: float) -> wait_exponential_jitter:
    """wait_exponential_jitter(initial, max) with jitter up to `initial` (1 s by default).

    tenacity >= 9.1 renamed `initial` to `multiplier` (and warns about the old name).
    """
    if "multiplier" in inspect.signature(wait_exponential_jitter).parameters:
        return wait_exponential_jitter(multiplier=initial, max=maximum, jitter=initial)
    return wait_exponential_jitter(initial=initial, max=maximum, jitter=initial)


def _as_list(value: Any) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def _close_chain(chain: list[Connection]) -> None:
    for conn in chain:
        with suppress(Exception):  # teardown
            conn.client.close()


class SSHTransport(AgentTransport):
    """The agent over one SSH exec channel; host keys verified; reconnects within a budget.

    Knobs (keyword-only) exist for tests and tuning: `sleep` (the wait between connect
    attempts, default interruptible by close()), `heartbeat`/`heartbeat_misses` (a host silent
    for heartbeat * misses seconds is declared lost), `kill_grace` (SIGTERM -> SIGKILL),
    `keepalive` (SSH keepalive interval), `retry_initial`/`retry_max` (exponential backoff),
    `python` (interpreter on the host), `become_mode` ("auto"; "sudo" forces the sudo helper
    even as root, for tests).
    """

    def __init__(
        self,
        spec: HostSpec,
        *,
        on_wait: WaitCallback | None = None,
        sleep: Callable[[float], Any] | None = None,
        heartbeat: float = 5.0,
        heartbeat_misses: int = 6,
        kill_grace: float = 2.0,
        keepalive: float = 15.0,
        retry_initial: float = 1.0,
        retry_max: float = 15.0,
        python: str = "python3",
        become_mode: str = "auto",
        start_timeout: float = 30.0,
    ) -> None:
        super().__init__(spec, heartbeat=heartbeat, heartbeat_misses=heartbeat_misses,
                         kill_grace=kill_grace, become_mode=become_mode)
        self.name = spec.name or spec.address or "host"
        self.on_wait = on_wait
        self._sleep = sleep if sleep is not None else self._closing.wait
        self.keepalive = keepalive
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.python = python
        self.start_timeout = start_timeout
        self._fabric_config: Config | None = None

    # ---- connect with retries ------------------------------------------------------------------
    def _start(self, budget: float | None) -> AgentSession:
        """Connect and start the agent, retrying transient failures for `budget` seconds."""
        budget = self.spec.connect_budget if budget is None else float(budget)
        base_wait = _backoff(self.retry_initial, self.retry_max)

        def wait(rs: RetryCallState) -> float:
            return min(base_wait(rs), max(0.0, budget - rs.seconds_since_start))

        retrying = Retrying(
            stop=stop_after_delay(budget),
            wait=wait,
            retry=retry_if_exception_type(TransientConnectError),
            reraise=True,
            before_sleep=self._before_sleep,
            sleep=self._sleep,
        )
        started = time.monotonic()
        session: AgentSession | None = None
        try:
            for attempt in retrying:
                with attempt:
                    if self._closing.is_set():
                        raise TransportError("connect aborted: the transport was closed",
                                             host=self.name)
                    session = self._open_session()
        except TransientConnectError as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            if attempts <= 1:
                raise
            detail = exc.message.removeprefix(f"{self.name}: ")
            raise TransientConnectError(
                f"{detail} (gave up after {attempts} attempts in "
                f"{time.monotonic() - started:.0f}s)",
                host=self.name,
                hint=exc.hint or "check that the host is up and sshd runs, or raise "
                "connect_budget",
            ) from exc
        assert session is not None
        log.info("connected", host=self.name, agent_pid=session.hello.get("pid"),
                 user=session.hello.get("user"), python=session.hello.get("python"),
                 elapsed=round(time.monotonic() - started, 3))
        return session

    def _before_sleep(self, rs: RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        elapsed = rs.seconds_since_start or 0.0
        message = exc.message if isinstance(exc, TransportError) else str(exc)
        log.warning("waiting for host", host=self.name, attempt=rs.attempt_number,
                    elapsed=round(elapsed, 1), error=message,
                    retry_in=round(rs.next_action.sleep, 1) if rs.next_action else None)
        if self.on_wait is not None and exc is not None:
            self.on_wait(rs.attempt_number, elapsed, exc)

    # ---- one attempt -------------------------------------------------------------------------
    def _connection(self) -> Connection:
        spec = self.spec
        connect_kwargs: dict[str, Any] = {}
        if spec.identity_file:
            key = os.path.expanduser(spec.identity_file)
            if not os.path.isfile(key):
                raise ConnectError(f"identity file {key} does not exist", host=self.name,
                                   hint="fix `identity_file:` in the inventory")
            connect_kwargs = {"key_filename": [key], "look_for_keys": False}
        if self._fabric_config is None:
            path = os.path.expanduser(spec.ssh_config) if spec.ssh_config else None
            if path and not os.path.isfile(path):
                raise ConnectError(f"ssh_config file {path} does not exist", host=self.name,
                                   hint="fix `ssh_config:` in the inventory, or remove it to "
                                   "use ~/.ssh/config")
            try:
                self._fabric_config = Config(runtime_ssh_path=path) if path else Config()
            except Exception as exc:  # noqa: BLE001 - a broken ssh_config
                raise ConnectError(f"cannot read the ssh configuration: {exc}",
                                   host=self.name) from None
        try:
            return Connection(
                spec.address or spec.name,
                user=spec.user,
                port=spec.port,
                config=self._fabric_config.clone(),
                connect_timeout=int(max(1, spec.connect_timeout)),
                connect_kwargs=connect_kwargs,
            )
        except Exception as exc:  # noqa: BLE001 - bad ProxyJump syntax etc.
            raise ConnectError(f"cannot resolve how to reach the host: {exc}",
                               host=self.name) from None

    def _open_session(self) -> AgentSession:
        conn = self._connection()
        chain: list[Connection] = []
        try:
            self._open_hop(conn, "", chain)
            tr = conn.transport
            timeout = self.spec.connect_timeout
            try:
                chan = tr.open_session(timeout=timeout)
                chan.set_combine_stderr(False)
                command = f"exec {shlex.quote(self.python)} -c {shlex.quote(BOOTSTRAP)}"
                _bounded(lambda: chan.exec_command(command), timeout, tr)
            except Exception as exc:  # noqa: BLE001 - translated below
                raise self._translate(exc, conn, "starting the agent") from None
            pipe = _ChannelPipe(chan, chain, stall=self.dead_after)
            session = self._new_session(pipe)
            session.start(timeout=max(self.start_timeout, timeout))
            return session
        except BaseException:
            _close_chain(chain)
            raise

    def _open_hop(self, conn: Connection, role: str, chain: list[Connection]) -> None:
        chain.append(conn)
        timeout = self.spec.connect_timeout
        _HostKeyPolicy.install(conn, self.spec, self.name, role)
        sock: Any = None
        gateway = conn.gateway
        if isinstance(gateway, Connection):
            # a jump host without keys of its own may use the target's (identity_file or the
            # target's IdentityFile); its own ssh_config keys are tried first
            keys = _as_list(gateway.connect_kwargs.get("key_filename"))
            for key in _as_list(conn.connect_kwargs.get("key_filename")):
                if key not in keys:
                    keys.append(key)
            if keys:
                gateway.connect_kwargs["key_filename"] = keys
            self._open_hop(gateway, "jump host", chain)
            try:
                sock = gateway.transport.open_channel(
                    "direct-tcpip", dest_addr=(conn.host, int(conn.port)), src_addr=("", 0),
                    timeout=timeout,
                )
            except Exception as exc:  # noqa: BLE001 - translated
                raise self._translate(
                    exc, gateway, f"opening a tunnel to {conn.host}:{conn.port}", role="jump host"
                ) from None
        elif gateway:
            try:
                sock = conn.open_gateway()  # ProxyCommand
            except Exception as exc:  # noqa: BLE001 - translated
                raise self._translate(exc, conn, "starting its ProxyCommand", role=role) from None
        kwargs = dict(conn.connect_kwargs)
        if not kwargs.get("key_filename"):
            kwargs.pop("key_filename", None)
        kwargs.update(
            hostname=conn.host, port=int(conn.port), username=conn.user, sock=sock,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
            channel_timeout=timeout,
        )
        try:
            conn.client.connect(**kwargs)
        except Exception as exc:  # noqa: BLE001 - translated
            raise self._translate(exc, conn, "connecting", role=role) from None
        conn.transport = conn.client.get_transport()
        if self.keepalive:
            conn.transport.set_keepalive(max(1, int(self.keepalive)))

    def _translate(self, exc: BaseException, conn: Connection, doing: str,
                   role: str = "") -> TransportError:
        return _translate(exc, conn, doing, self.name, _known_hosts(self.spec), role)


def _translate(exc: BaseException, conn: Connection, doing: str, host: str, known: Path,
               role: str = "") -> TransportError:
    """paramiko/socket error EXC of DOING on the hop CONN as one of ours (HOST: the host's
    name in messages; KNOWN: its known_hosts file)."""
    if isinstance(exc, TransportError):
        return exc
    where = f"{conn.user}@{conn.host}:{conn.port}"
    who = f"{role} {where}" if role else where
    if isinstance(exc, (_UnknownHostKey, BadHostKeyException)):
        return _host_key_error(exc, conn, who, host, known)
    auth = _auth_error(exc, conn, doing, who, host)
    return auth if auth is not None else _network_error(exc, conn, doing, who, host)

def _host_key_error(exc: _UnknownHostKey | BadHostKeyException, conn: Connection,
                    who: str, host: str, known: Path) -> HostKeyError:
    if isinstance(exc, _UnknownHostKey):
        alg = exc.key.get_name()
        port = "" if int(conn.port) == 22 else f" -p {conn.port}"
        keyscan = f"ssh-keyscan -t {alg}{port} {conn.host}"
        trust = f"`{keyscan} >> {known}`"
        if isinstance(conn.gateway, Connection):  # not reachable from here directly
            trust = (f"running `{keyscan}` on the jump host {conn.gateway.host} and "
                     f"appending its output to {known}")
        return HostKeyError(
            f"unknown host key for {who}: {exc.name} is not in {known} "
            f"(it offers {alg} {fingerprint(exc.key)}); refusing to connect "
            "(host_key_policy: strict)",
            host=host,
            hint=f"check the fingerprint on the host (`ssh-keygen -lf "
            f"/etc/ssh/ssh_host_*_key.pub`), then trust it by {trust}, or set "
            "`host_key_policy: accept-new` to record it on first use",
        )
    name = known_hosts_name(conn.host, conn.port)
    return HostKeyError(
        f"HOST KEY CHANGED for {who}! {known} has {exc.expected_key.get_name()} "
        f"{fingerprint(exc.expected_key)}, the host now offers "
        f"{exc.key.get_name()} {fingerprint(exc.key)}. Someone could be intercepting the "
        "connection (man-in-the-middle), or the host was reinstalled. Refusing to connect.",
        host=host,
        hint=f"if you know why the key changed, remove the old entry with "
        f"`ssh-keygen -R '{name}' -f {known}` and add the new one",
    )

def _auth_error(exc: BaseException, conn: Connection, doing: str,
                who: str, host: str) -> TransportError | None:
    if isinstance(exc, AuthenticationException) and "transport shut down or saw EOF" in str(
            exc):
        # paramiko's words for a connection that died DURING authentication: not a refusal
        return TransientConnectError(f"{doing} {who}: the connection closed during "
                                     "authentication", host=host)
    keys = conn.connect_kwargs.get("key_filename") or []
    tried = ", ".join(keys) if keys else "ssh-agent keys and ~/.ssh/id_*"
    if isinstance(exc, PasswordRequiredException):
        return AuthError(
            f"authentication to {who} failed: the private key is encrypted ({exc})",
            host=host, hint="load the key into ssh-agent, or use an unencrypted key",
        )
    if isinstance(exc, AuthenticationException) or (
        isinstance(exc, SSHException) and "No authentication methods" in str(exc)
    ):
        return AuthError(
            f"authentication to {who} failed as user {conn.user!r} (tried: {tried}): {exc}",
            host=host,
            hint=f"add the public key to ~{conn.user}/.ssh/authorized_keys on the host "
            f"(e.g. `ssh-copy-id -i KEY.pub -p {conn.port} {conn.user}@{conn.host}`), or "
            "set `user:` / `identity_file:` for this host in the inventory",
        )
    return None

def _network_error(exc: BaseException, conn: Connection, doing: str,
                   who: str, host: str) -> TransportError:
    if isinstance(exc, socket.gaierror):
        if exc.errno == socket.EAI_AGAIN:
            return TransientConnectError(f"{doing} {who}: name lookup failed "
                                         f"temporarily ({exc})", host=host)
        return ConnectError(f"{doing} {who}: cannot resolve host name {conn.host!r}",
                            host=host, hint="fix `address:` or the ssh_config HostName")
    if isinstance(exc, IncompatiblePeer):
        return ConnectError(f"{doing} {who}: no common SSH algorithms ({exc})",
                            host=host)
    if isinstance(exc, NoValidConnectionsError):
        return TransientConnectError(f"{doing} {who}: connection refused", host=host)
    if isinstance(exc, TimeoutError):
        return TransientConnectError(f"{doing} {who}: timed out", host=host)
    if isinstance(exc, ChannelException):
        return TransientConnectError(f"{doing} via {who}: {exc.text or exc}", host=host)
    if isinstance(exc, OSError):  # refused, reset, unreachable, ...: the host may be booting
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return TransientConnectError(f"{doing} {who}: {reason}", host=host)
    if isinstance(exc, (EOFError, SSHException, PipeClosed)):
        return TransientConnectError(f"{doing} {who}: {exc or type(exc).__name__}",
                                     host=host)
    return ConnectError(f"{doing} {who}: unexpected {type(exc).__name__}: {exc}",
                        host=host)


def _bounded(fn: Callable[[], Any], timeout: float, transport: paramiko.Transport) -> Any:
    """Run a paramiko call that has no timeout of its own; close the transport if it hangs."""
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        transport.close()

    timer = threading.Timer(timeout, fire)
    timer.daemon = True
    timer.start()
    try:
        return fn()
    except Exception:
        if fired.is_set():
            raise TimeoutError(f"no answer within {timeout:g}s") from None
        raise
    finally:
        timer.cancel()
