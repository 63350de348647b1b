"""The orchestrator agent: a stdlib-only Python (3.8+) program that runs ON the host.

The client starts it over ONE long-lived channel (an SSH exec channel, or local pipes) with
`python3 -c BOOTSTRAP` (the text of orchestrator/remote/bootstrap.py). The bootstrap reads this
file's source from stdin (10 ASCII digits of length, then the source) and executes it; from then
on both sides exchange frames:

    frame  = struct ">II" (header length, body length) + header (UTF-8 JSON object) + body bytes

Client -> agent (`op`): init (first frame: settings + shipped modules), run, kill, kill_all,
read_file, write_file, probe (a named read), act (a named action: it changes the host),
load_all (import every shipped module now).
Agent -> client (`t`): hello (answer to init; lists the probes and the actions), out (a chunk of
a command's stdout/stderr, raw bytes in the body), hb (heartbeat, sent while requests are in
flight), done (a command ended), result, error. The shipped modules are importable by name on
the host (`ShippedModules`); the probe and action registry is orchestrator.remote.probes.
Every request carries an `id`; answers echo it.

The one thing the agent writes for itself: each shipped module compiled once, marshalled in
~/.cache/orchestrator-agent/ (keyed by the source's hash and the Python's bytecode magic), so a
connection does not compile 100 KB of Python again (`cached_compile`). It is read only from a
directory and a file owned by the effective uid and writable by no other (a root helper has its
own: bootstrap.cache_path), and not written at all on a read-only (dry) run.

Guarantees:
  - A command runs as `/bin/sh -c CMD` in its own process group (new session). Its env values
    arrive inside the request and reach the child through the process environment, never argv.
  - On timeout the agent kills the command's whole process group (SIGTERM, grace, SIGKILL).
  - When the agent's stdin reaches EOF (client gone, connection dropped, sshd killed) or the
    agent gets SIGTERM/SIGHUP/SIGINT, it kills every running command's process group and exits.
  - become=True as non-root: the agent starts a helper agent under `sudo -n` once and relays
    those requests to it, so env, timeouts and group kills work the same as root.
  - write_file is atomic: temp file in the same directory, fsync, os.replace, fsync of the dir.
    An agent exiting mid-write (the connection was cut) finishes the write or removes its
    temp file first: the target holds the old or the new content, and no temp file is left.

This module imports of the package only what the client ships with it (the bootstrap, for the
code cache) and must stay Python 3.8 compatible (no
`match`, no `X | Y` at runtime, no 3.9+ stdlib APIs).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pwd
import re
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import types
from contextlib import suppress

PROTOCOL = 1
#: written once before the first frame: the client skips anything before it (a login shell's
#: rc files may print text into the channel before python even starts)
MAGIC = b"\0orchestrator-agent-1\0"
FRAME = struct.Struct(">II")
MAX_HEADER = 64 * 1024 * 1024
CHUNK = 65536

def encode_source(source: bytes) -> bytes:
    """What the bootstrap expects on stdin: 10 ASCII digits of length, then the source."""
    return b"%010d" % len(source) + source


def pack(header: dict, body: bytes = b"") -> bytes:
    """Encode one frame."""
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return FRAME.pack(len(h), len(body)) + h + body


class ChannelClosed(Exception):
    """The other side of the frame channel went away."""


class FrameIO:
    """Framed messages over a pair of file descriptors (thread-safe sending)."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_in = fd_in
        self.fd_out = fd_out
        self.lock = threading.Lock()
        self.broken = False

    def _read_exact(self, n: int) -> bytes:
        parts = []
        left = n
        while left:
            chunk = os.read(self.fd_in, min(left, 1 << 20))
            if not chunk:
                raise ChannelClosed()
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def expect_magic(self) -> None:
        """Read MAGIC (a helper agent's first bytes) or raise ChannelClosed."""
        if self._read_exact(len(MAGIC)) != MAGIC:
            raise ChannelClosed()

    def send_magic(self) -> None:
        with self.lock:
            _write_all(self.fd_out, MAGIC)

    def recv(self):
        """Return (header, body); raise ChannelClosed at EOF."""
        hlen, blen = FRAME.unpack(self._read_exact(FRAME.size))
        if hlen > MAX_HEADER:
            raise ChannelClosed()
        header = json.loads(self._read_exact(hlen).decode("utf-8"))
        body = self._read_exact(blen) if blen else b""
        return header, body

    def stop_sending(self) -> None:
        """Send nothing more (`send` answers False), e.g. once the agent is exiting."""
        with self.lock:
            self.broken = True

    def send(self, header: dict, body: bytes = b"") -> bool:
        """Send one frame; False (and no exception) when the channel is gone."""
        data = pack(header, body)
        with self.lock:
            if self.broken:
                return False
            try:
                _write_all(self.fd_out, data)
            except OSError:
                self.broken = True
                return False
        return True


class Shutdown(Exception):
    """Raised in the main thread by a termination signal."""


def _group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        pids = os.listdir("/proc")
    except OSError:
        return True  # no /proc: trust killpg (zombies count as alive there)
    for name in pids:
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state ppid pgrp ...; zombies are dead, merely not reaped yet (an orphan's
        # reaper may be a PID 1 that never reaps)
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Job:
    """One running command."""

    def __init__(self, req_id) -> None:
        self.id = req_id
        self.proc = None  # type: subprocess.Popen | None
        self.killed = None  # type: str | None  # "timeout" | "kill" | "shutdown"
        self.lock = threading.Lock()
        self.killer = None  # type: threading.Thread | None

    def kill(self, reason: str, grace: float) -> None:
        """Kill the job's process group (async): SIGTERM, wait `grace`, SIGKILL."""
        with self.lock:
            if self.killed is None:
                self.killed = reason
            if self.proc is None or self.killer is not None:
                return
            proc = self.proc
            self.killer = threading.Thread(
                target=kill_group, args=(proc, grace), name=f"kill-{self.id}", daemon=True
            )
            self.killer.start()


def kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process group led by `proc`, give it `grace` seconds, then SIGKILL it."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        proc.poll()  # reap the leader, or its zombie keeps the group "alive"
        if proc.returncode is not None and not _group_alive(pgid):
            return
        time.sleep(0.02)
    _signal_group(pgid, signal.SIGKILL)
    proc.poll()


class Jobs:
    """The commands this agent runs (`run` requests) by request id: started, streamed to the
    client, killed on request, on timeout or at shutdown."""

    def __init__(self, io: FrameIO) -> None:
        self.io = io
        self.grace = 2.0
        self.table = {}  # type: dict
        self.lock = threading.Lock()

    def add(self, rid) -> None:
        """Register the job of request RID before it starts: a kill may arrive first."""
        with self.lock:
            self.table[rid] = Job(rid)

    def kill(self, rid, reason: str) -> None:
        with self.lock:
            job = self.table.get(rid)
        if job is not None:
            job.kill(reason, self.grace)

    def kill_all(self, reason: str) -> list:
        with self.lock:
            jobs = list(self.table.values())
        for job in jobs:
            job.kill(reason, self.grace)
        return jobs

    def run(self, header: dict, body: bytes) -> None:
        """Run one command (a `run` request) and send its output and its `done`."""
        rid = header.get("id")
        with self.lock:
            job = self.table.setdefault(rid, Job(rid))
        env = dict(os.environ)
        for k, v in (header.get("env") or {}).items():
            env[str(k)] = str(v)
        want_stdin = bool(header.get("stdin"))
        start = time.monotonic()
        try:
            with job.lock:
                if job.killed is not None:
                    raise _NotStarted("killed before it started")
                job.proc = subprocess.Popen(
                    # `--`: a command starting with "-" (a path like `-rf/bin/python`) is a
                    # command, never options of the shell itself
                    ["/bin/sh", "-c", "--", header["cmd"]],
                    stdin=subprocess.PIPE if want_stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    cwd=os.path.expanduser(header["cwd"]) if header.get("cwd") else None,
                    env=env, start_new_session=True, close_fds=True,
                )
        except (OSError, _NotStarted) as exc:
            what = ("cwd {!r}: {}".format(header.get("cwd"), exc.strerror)
                    if isinstance(exc, OSError) and header.get("cwd") else str(exc))
            self.io.send({"t": "out", "id": rid, "fd": 2},
                         (f"orchestrator agent: cannot start command: {what}\n").encode())
            self.io.send({"t": "done", "id": rid, "exit": 126, "duration": 0.0,
                          "timed_out": False, "killed": job.killed, "not_started": True})
            return
        proc = job.proc
        if want_stdin:
            threading.Thread(target=_feed, args=(proc.stdin, body), name=f"stdin-{rid}",
                             daemon=True).start()
        self._pump(job, proc, start, header.get("timeout"))
        rc = proc.returncode
        if job.killer is not None:
            job.killer.join()
        self.io.send({
            "t": "done", "id": rid, "exit": rc if rc >= 0 else 128 - rc,
            "signal": -rc if rc < 0 else None, "duration": time.monotonic() - start,
            "timed_out": job.killed == "timeout", "killed": job.killed, "pid": proc.pid,
        })

    def _pump(self, job: Job, proc: subprocess.Popen, start: float, timeout) -> None:
        """Stream stdout/stderr until both close (or linger after exit); enforce timeout."""
        deadline = start + float(timeout) if timeout else None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, 1)
        sel.register(proc.stderr, selectors.EVENT_READ, 2)
        open_streams = 2
        exited_at = None
        last_data = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and job.killed is None and now >= deadline:
                    job.kill("timeout", self.grace)
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if open_streams == 0:
                    if exited_at is not None:
                        break
                    wait = 0.5
                    if deadline is not None and job.killed is None:
                        wait = min(wait, max(0.0, deadline - now))
                    with suppress(subprocess.TimeoutExpired):
                        proc.wait(wait)
                    continue
                if exited_at is not None:
                    # the leader exited; something it started in the background still holds
                    # the pipes: take what is there, then stop (do not wait for daemons)
                    if now - last_data > 0.25 or now - exited_at > 2.0:
                        break
                    wait = 0.05
                else:
                    wait = 0.5
                    if deadline is not None and job.killed is None:
                        wait = min(wait, max(0.0, deadline - now))
                for key, _ in sel.select(wait):
                    try:
                        data = os.read(key.fileobj.fileno(), CHUNK)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                        continue
                    last_data = time.monotonic()
                    self.io.send({"t": "out", "id": job.id, "fd": key.data}, data)
        finally:
            sel.close()
            for stream in (proc.stdout, proc.stderr):
                with suppress(OSError):
                    stream.close()
            proc.wait()


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class SubAgent:
    """A helper agent started under sudo (as root) to serve become=True requests."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.proc = None  # type: subprocess.Popen | None
        self.io = None  # type: FrameIO | None
        self.ids = set()  # type: set
        self.lock = threading.Lock()  # state; held only briefly
        self.spawn_lock = threading.Lock()  # one sudo start at a time (may take seconds)

    def _spawn(self, argv: list, prefix: bytes):
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            bufsize=0, start_new_session=True, close_fds=True,
        )
        io = FrameIO(proc.stdout.fileno(), proc.stdin.fileno())
        init = dict(self.agent.init)
        init["become"] = "auto"
        init.pop("become_password", None)
        try:
            data = prefix + encode_source(self.agent.source) + pack(init)
            _write_all(proc.stdin.fileno(), data)
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(60):
                raise ChannelClosed()
            sel.close()
            io.expect_magic()
            header, _ = io.recv()
            if header.get("t") != "hello":
                raise ChannelClosed()
        except (ChannelClosed, OSError, ValueError):
            with suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            err = proc.stderr.read().decode("utf-8", "replace").strip()
            proc.stderr.close()
            proc.stdout.close()
            return None, None, err or f"exit code {proc.returncode}"
        return proc, io, None

    def ensure(self):
        """Start the helper if needed; return None or an error message."""
        with self.spawn_lock:
            with self.lock:
                if self.proc is not None and self.proc.poll() is None:
                    return None
            user = _user_name(os.getuid())
            py = sys.executable or "python3"
            how = "`sudo -n`"
            bootstrap = self.agent.shipped.sources.get("bootstrap")
            if bootstrap is None:
                return "become: the agent bootstrap was not shipped with the agent"
            try:
                proc, io, err = self._spawn(
                    ["sudo", "-n", "--", py, "-c", bootstrap], b"")
                password = self.agent.init.get("become_password")
                if proc is None and password and "password" in (err or ""):
                    how = "sudo with the inventory's become_password"
                    proc, io, err = self._spawn(
                        ["sudo", "-S", "-k", "-p", "", "--", py, "-c", bootstrap],
                        password.encode("utf-8") + b"\n",
                    )
            except FileNotFoundError:
                return (
                    f"become: sudo is not installed on the host, and the agent runs as "
                    f"{user!r}, not root. Install sudo and configure passwordless sudo for "
                    f"{user!r}, or connect as root."
                )
            if proc is None:
                return (
                    f"become: {how} failed for user {user!r}: {err}. Configure "
                    f"passwordless sudo for {user!r} (e.g. `{user} ALL=(ALL) NOPASSWD: ALL` in "
                    f"/etc/sudoers.d/{user}), or connect as root."
                )
            with self.lock:
                self.proc, self.io = proc, io
            threading.Thread(target=self._relay, args=(proc, io), name="sub-relay",
                             daemon=True).start()
            threading.Thread(target=_discard, args=(proc.stderr,), name="sub-stderr",
                             daemon=True).start()
            return None

    def _relay(self, proc, io) -> None:
        while True:
            try:
                header, body = io.recv()
            except (ChannelClosed, OSError, ValueError):
                break
            rid = header.get("id")
            if header.get("t") in ("done", "result", "error"):
                with self.lock:
                    self.ids.discard(rid)
            if header.get("t") != "hello":
                self.agent.io.send(header, body)
        with self.lock:
            lost = list(self.ids)
            self.ids.clear()
            if self.proc is proc:
                self.proc = None
                self.io = None
        for rid in lost:
            self.agent.io.send({
                "t": "error", "id": rid, "kind": "become",
                "message": "the root helper agent (started with sudo) exited unexpectedly",
            })
        with suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    def forward(self, header: dict, body: bytes) -> bool:
        with self.lock:
            io = self.io
            if io is None:
                return False
            self.ids.add(header.get("id"))
        return io.send(header, body)

    def forward_kill(self, header: dict) -> None:
        with self.lock:
            io = self.io
            wanted = header.get("op") == "kill_all" or header.get("target") in self.ids
        if io is not None and wanted:
            io.send(header)

    def close(self, wait: float) -> None:
        with self.lock:
            proc = self.proc
        if proc is None:
            return
        with suppress(OSError):
            proc.stdin.close()  # EOF: the helper kills its commands and exits
        with suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


def _discard(stream) -> None:
    with suppress(OSError, ValueError):
        while stream.read(65536):
            pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


#: how a shipped module registers a name (orchestrator.remote.probes: `@probe("disk_free")`)
_REGISTERS = re.compile(r'^@(probe|action)\(\s*"([^"]+)"\s*\)', re.MULTILINE)


def _cache_store(source: bytes, filename: str, code) -> None:
    """Keep CODE marshalled where the bootstrap's `cache_path` says, only in a directory it
    would read from (`open_cache_dir`; made 0700): a temp file made 0600 with O_EXCL, renamed
    in place. Best effort: a read-only home keeps none."""
    import marshal

    try:
        boot = importlib.import_module("orchestrator.remote.bootstrap")  # shipped: see its doc
        path = boot.cache_path(source, filename)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        d = boot.open_cache_dir(path)
    except Exception:  # noqa: BLE001 - no cache
        return
    tmp = "." + os.urandom(8).hex() + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=d)
        try:
            _write_all(fd, marshal.dumps(code))
        finally:
            os.close(fd)
        os.replace(tmp, os.path.basename(path), src_dir_fd=d, dst_dir_fd=d)
    except Exception:  # noqa: BLE001 - no cache
        with suppress(OSError):
            os.unlink(tmp, dir_fd=d)
    finally:
        os.close(d)


def cached_compile(source: str, filename: str, keep: bool = True):
    """compile(source), kept marshalled (`_cache_store`, unless not KEEP: a dry run writes
    nothing) where the bootstrap reads it back (`cache_read`), so a host compiles each shipped
    module once, not at every connection. Best effort: any problem with it just compiles."""
    data = source.encode("utf-8")
    try:
        code = importlib.import_module("orchestrator.remote.bootstrap").cache_read(data, filename)
    except ImportError:  # no bootstrap shipped: no cache
        code = None
    if code is None:
        code = compile(source, filename, "exec")
        if keep:
            _cache_store(data, filename, code)
    return code


class ShippedModules:
    """The modules the client shipped, importable as `orchestrator.remote.<name>` (a meta path
    finder and loader: they import each other in any order, and tracebacks and
    `orchestrator.remote.probes.module_source` see their text through `get_source`), and the
    probes and actions they register (`@probe("NAME")`, `@action("NAME")`,
    orchestrator.remote.probes), learnt from their text."""

    PREFIX = "orchestrator.remote."

    def __init__(self, modules: list, keep: bool = True) -> None:
        self.sources = dict(modules)  # type: dict  # name -> source text
        self.keep = keep  # keep their compiled code in the cache (not on a dry run)
        self.tables = {"probe": {}, "action": {}}  # type: dict  # kind -> name -> function
        self.lazy = {"probe": {}, "action": {}}  # type: dict  # kind -> name -> module
        self.errors = {}  # type: dict  # module -> why it did not import
        self.lock = threading.Lock()
        for name, text in modules:
            for kind, registered in _REGISTERS.findall(text):
                self.lazy[kind][registered] = name

    def install(self) -> None:
        """Make the modules importable and import the registry (probes) only: a module is
        imported when one of its names is first called, so a converged re-run never pays for
        the CUDA check, the supervisor or the router's modules (about half of the agent's
        start-up on a host)."""
        for pkg in ("orchestrator", "orchestrator.remote"):
            mod = types.ModuleType(pkg)
            mod.__path__ = []  # type: ignore[attr-defined]
            sys.modules[pkg] = mod
        sys.meta_path.insert(0, self)
        if "probes" in self.sources:
            self.load("probes")
        probes_mod = sys.modules.get("orchestrator.remote.probes")
        if probes_mod is not None:
            self.tables = {"probe": getattr(probes_mod, "PROBES", {}),
                           "action": getattr(probes_mod, "ACTIONS", {})}

    def load(self, name: str) -> None:
        """Import the module NAME; what it raises goes to `errors`."""
        with self.lock:
            if name in self.errors:
                return
            try:
                importlib.import_module(self.PREFIX + name)
            except Exception as exc:
                self.errors[name] = f"{type(exc).__name__}: {exc}"

    def load_all(self) -> dict:
        """Import every module now; the import errors, by module (empty: all load)."""
        for name in sorted(self.sources):
            self.load(name)
        return dict(self.errors)

    def lookup(self, kind: str, name):
        """The function registered as probe/action NAME, importing its module on first use."""
        fn = self.tables[kind].get(name)
        if fn is None and name in self.lazy[kind]:
            self.load(self.lazy[kind][name])
            fn = self.tables[kind].get(name)
        return fn

    def names(self, kind: str) -> list:
        """Every probe (or action) name, loaded or not."""
        return sorted(set(self.tables[kind]) | set(self.lazy[kind]))

    def _name(self, fullname: str):
        name = fullname[len(self.PREFIX):] if fullname.startswith(self.PREFIX) else None
        return name if name in self.sources else None

    def find_spec(self, fullname: str, path=None, target=None):
        name = self._name(fullname)
        if name is None:
            return None
        return importlib.util.spec_from_loader(fullname, self,
                                               origin=f"orchestrator/remote/{name}.py")

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module) -> None:
        name = self._name(module.__name__)
        module.__file__ = f"orchestrator/remote/{name}.py"
        source = self.sources[name]
        # the bootstrap reads the cache itself (cached_compile imports it)
        exec(compile(source, module.__file__, "exec") if name == "bootstrap"
             else cached_compile(source, module.__file__, self.keep), module.__dict__)

    def get_source(self, fullname: str):
        name = self._name(fullname)
        return self.sources[name] if name is not None else None


class Agent:
    """The request loop: reads frames, serves each request in its own thread."""

    def __init__(self, io: FrameIO, source: bytes) -> None:
        self.io = io
        self.source = source
        self.init = {}  # type: dict
        self.heartbeat = 5.0
        self.grace = 2.0
        self.jobs = Jobs(io)
        self.writes = set()  # type: set  # temp files of write_file requests in progress
        self.lock = threading.Lock()
        self.active = 0
        self.shutting_down = False
        self.client_timeout = 0.0  # kill everything if the client is silent this long (0: off)
        self.last_client = time.monotonic()
        self.sub = SubAgent(self)
        self.shipped = ShippedModules([])
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def hello(self) -> dict:
        uid = os.getuid()
        starttime, boot_id = _identity()
        return {
            "t": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "uid": uid,
            "user": _user_name(uid), "python": ".".join(map(str, sys.version_info[:3])),
            "executable": sys.executable, "probes": self.shipped.names("probe"),
            "actions": self.shipped.names("action"),
            "module_errors": self.shipped.errors,
            # pid + start time + boot id name this agent process uniquely (agent_retire)
            "starttime": starttime, "boot_id": boot_id,
        }

    # ---- main loop ---------------------------------------------------------------------
    def serve(self) -> None:
        self.io.send_magic()
        header, _ = self.io.recv()
        if header.get("op") != "init":
            raise ChannelClosed()
        self.init = header
        self.heartbeat = float(header.get("heartbeat") or 5.0)
        self.grace = self.jobs.grace = float(header.get("grace") or 2.0)
        self.client_timeout = float(header.get("client_timeout") or 0.0)
        # a read-only (dry) run leaves no trace on the host: no code cache written
        self.shipped = ShippedModules(header.get("modules") or [],
                                      keep=not header.get("read_only"))
        self.shipped.install()
        self.io.send(self.hello())
        own = globals().get("AGENT_CODE")  # None when the bootstrap read it from the cache
        if own is not None and self.shipped.keep:
            _cache_store(self.source, "orchestrator/remote/agent.py", own)
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        while True:
            header, body = self.io.recv()
            self.last_client = time.monotonic()
            self.dispatch(header, body)

    def _heartbeat(self) -> None:
        """While requests run: heartbeat the client, and give up on a client gone silent.

        The client pulses while it waits for answers; a client that vanished without closing
        the connection (its machine froze, the network died) must not leave commands running.
        """
        while True:
            time.sleep(self.heartbeat)
            with self.lock:
                busy = self.active > 0 or bool(self.sub.ids)
            if not busy:
                self.last_client = max(self.last_client, time.monotonic() - self.heartbeat)
                continue
            silent = time.monotonic() - self.last_client
            if self.client_timeout and silent > self.client_timeout:
                sys.stderr.write(
                    f"orchestrator agent: no message from the client for {silent:.0f}s; "
                    "killing its commands and exiting\n")
                self.shutdown()
                sys.stderr.flush()
                os._exit(2)
            if not self.io.send({"t": "hb"}):
                return

    def dispatch(self, header: dict, body: bytes) -> None:
        op = header.get("op")
        rid = header.get("id")
        if op == "hb":  # the client's pulse (see _heartbeat)
            return
        if op == "kill":
            self.jobs.kill(header.get("target"), "kill")
            self.sub.forward_kill(header)
            return
        if op == "kill_all":
            self.jobs.kill_all("kill")
            self.sub.forward_kill(header)
            return
        handler = {
            "run": self.jobs.run, "read_file": self.op_read_file,
            "write_file": self.op_write_file, "probe": self.op_probe, "act": self.op_act,
            "load_all": self.op_load_all,
        }.get(op)
        if handler is None:
            self.io.send({"t": "error", "id": rid, "kind": "protocol",
                          "message": f"unknown operation {op!r}"})
            return
        if op == "run":
            if (header.get("become") and not header.get("become_local")
                    and (os.getuid() != 0 or self.init.get("become") == "sudo")):
                handler = self.op_run_become
            else:
                self.jobs.add(rid)
        with self.lock:
            self.active += 1
        threading.Thread(target=self._serve_one, args=(handler, header, body),
                         name=f"req-{rid}", daemon=True).start()

    def _serve_one(self, handler, header: dict, body: bytes) -> None:
        rid = header.get("id")
        try:
            handler(header, body)
        except Exception as exc:
            import traceback

            self.io.send({
                "t": "error", "id": rid, "kind": "exception",
                "message": f"{type(exc).__name__}: {exc}",
                "errno": getattr(exc, "errno", None),
                "traceback": traceback.format_exc(limit=8),
            })
        finally:
            with self.lock:
                self.active -= 1
            with self.jobs.lock:
                self.jobs.table.pop(rid, None)

    # ---- operations --------------------------------------------------------------------
    def op_probe(self, header: dict, body: bytes) -> None:
        self._call_named(header, "probe", "action", "an action, not a probe: it changes the host")

    def op_act(self, header: dict, body: bytes) -> None:
        self._call_named(header, "action", "probe", "a probe, not an action")

    def op_load_all(self, header: dict, body: bytes) -> None:
        self.io.send({"t": "result", "id": header.get("id"), "value": self.shipped.load_all()})

    def _call_named(self, header: dict, kind: str, other: str, refusal: str) -> None:
        """Call the KIND (probe/action) `header["name"]`; a name of the OTHER kind is refused
        (REFUSAL says why): a probe never changes the host, and an action is never asked as a
        probe."""
        name = header.get("name")
        fn = self.shipped.lookup(kind, name)
        if fn is None:
            if name in self.shipped.names(other):
                message = f"{name!r} is {refusal}"
            else:
                message = "unknown {} {!r}; available: {}{}".format(
                    kind, name, ", ".join(self.shipped.names(kind)) or "(none)",
                    f"; modules that failed to load: {self.shipped.errors}"
                    if self.shipped.errors else "")
            self.io.send({"t": "error", "id": header.get("id"), "kind": "unknown_" + kind,
                          "message": message})
            return
        value = fn(**(header.get("args") or {}))
        self.io.send({"t": "result", "id": header.get("id"), "value": value})

    def op_read_file(self, header: dict, body: bytes) -> None:
        path = os.path.expanduser(header["path"])
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except (FileNotFoundError, NotADirectoryError):
            self.io.send({"t": "result", "id": header.get("id"), "value": None})
            return
        self.io.send({"t": "result", "id": header.get("id"), "value": len(data)}, data)

    def op_write_file(self, header: dict, body: bytes) -> None:
        path = os.path.abspath(os.path.expanduser(header["path"]))
        mode = header.get("mode")
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        import tempfile

        # made and registered under the lock that _finish_writes reads `writes` under: a write
        # that starts once shutdown() began would leave its temp file behind (the agent exits
        # without waiting for it), so it starts nothing; nothing is sent from then on anyway
        with self.lock:
            if self.shutting_down:
                return
            fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".",
                                       suffix=".tmp", dir=directory)
            self.writes.add(tmp)
        try:
            _write_all(fd, body)
            if mode is None:
                mode = (st.st_mode & 0o7777) if st is not None else (0o666 & ~self.umask)
            os.fchmod(fd, mode)
            if st is not None and os.getuid() == 0:
                os.fchown(fd, st.st_uid, st.st_gid)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            with self.lock:
                self.writes.discard(tmp)
        with suppress(OSError):
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self.io.send({"t": "result", "id": header.get("id"), "value": len(body)})

    def op_run_become(self, header: dict, body: bytes) -> None:
        err = self.sub.ensure()
        if err is not None:
            self.io.send({"t": "error", "id": header.get("id"), "kind": "become",
                          "message": err})
            return
        fwd = dict(header)
        fwd["become_local"] = True
        if not self.sub.forward(fwd, body):
            self.io.send({"t": "error", "id": header.get("id"), "kind": "become",
                          "message": "the root helper agent (started with sudo) is gone"})

    # ---- shutdown ----------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every running command's process group, stop the helper, exit.

        Nothing is sent from here on: a command killed because the agent is going away (its
        SIGHUP, SIGTERM, a silent client) must reach the client as the connection lost, not as
        the command's own exit status (143 after our SIGTERM), which a stage would take for its
        command failing."""
        self.shutting_down = True
        self.io.stop_sending()
        jobs = self.jobs.kill_all("shutdown")
        self.sub.close(self.grace + 1.0)
        end = time.monotonic() + self.grace + 1.0
        for job in jobs:
            killer = job.killer
            if killer is not None:
                killer.join(max(0.0, end - time.monotonic()))
        self._finish_writes(end)

    def _finish_writes(self, end: float) -> None:
        """Let write_file requests whose body arrived finish (until `end`), then remove the
        temp file of any still running: exiting mid-write must not leave a `.NAME.*.tmp`."""
        while time.monotonic() < end:
            with self.lock:
                if not self.writes:
                    return
            time.sleep(0.01)
        with self.lock:
            left = list(self.writes)
        for tmp in left:
            with suppress(OSError):
                os.unlink(tmp)  # the rename then fails: the target keeps its old content


class _NotStarted(Exception):
    pass


def _feed(stream, data: bytes) -> None:
    with suppress(OSError):
        stream.write(data)
    with suppress(OSError):
        stream.close()


def _identity():
    """(start time of this process in clock ticks since boot, the kernel's boot id); None each
    where /proc does not tell."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            starttime = int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        starttime = None
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot_id = fh.read().strip() or None
    except OSError:
        boot_id = None
    return starttime, boot_id


def _on_signal(signum, frame) -> None:
    raise Shutdown()


def main(source: bytes) -> None:
    """Run the agent on fds 0/1; fds 0 and 1 are then pointed at /dev/null."""
    fd_in = os.dup(0)
    fd_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # a stray print() must not corrupt the protocol
    agent = Agent(FrameIO(fd_in, fd_out), source)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)
    code = 0
    try:
        agent.serve()
    except (ChannelClosed, Shutdown):
        pass
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        agent.shutdown()
    finally:
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__orchestrator_agent__":
    main(AGENT_SOURCE)  # type: ignore[name-defined]  # noqa: F821
elif __name__ == "__main__":
    with open(__file__, "rb") as _fh:
        main(_fh.read())
