"""SSH endpoints of simulated hosts: an embedded paramiko server, or a real OpenSSH sshd.

Embedded (`EmbeddedEndpoint`): one listening socket per host on the host's own loopback address;
public-key auth against SIMDIR/authorized_keys for the configured user; ``exec`` runs
``/bin/sh -c CMD`` as a real subprocess in its own session (cwd HOME, the host's environment plus
what the client sent with ``env`` requests), stdin/stdout/stderr piped, exit status returned, and
the whole process group killed when the channel or connection closes first. ``shell`` (with or
without a pty) and the ``sftp`` subsystem are supported too.

OpenSSH (`OpenSSHEndpoint`): ``/usr/sbin/sshd -D`` with its own config, host key and a
``ForceCommand`` wrapper that sets up the same environment. It behaves like OpenSSH (a closed
channel does not kill the command).

Both can be stopped (connection refused, live sessions dropped) and started again on the same
port, which is how reboots and ``pct stop`` look from the client side.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pty
import random
import shutil
import signal
import socket
import stat
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from orchestrator_sim import procs
from orchestrator_sim.hosts import SimHost

log = logging.getLogger("orchestrator_sim.ssh")

#: (rate, within_seconds) when the host's ssh-flaky fault is on, else None
FlakyFn = Callable[[], "tuple[float, float] | None"]


def load_authorized(path: Path) -> set[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return set()
    keys = set()
    for line in lines:
        parts = line.split()
        for i, part in enumerate(parts):
            if part.startswith(("ssh-", "ecdsa-")) and i + 1 < len(parts):
                keys.add(parts[i + 1])
                break
    return keys


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _kill_group(proc: subprocess.Popen, grace: float = 0.5) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


class _Session:
    """One channel's command: the process and the pumps between it and the channel."""

    def __init__(self, endpoint: EmbeddedEndpoint, transport: paramiko.Transport,
                 channel: paramiko.Channel, env: dict[str, str]):
        self.endpoint = endpoint
        self.transport = transport
        self.channel = channel
        self.env = env
        self.pty_size: tuple[int, int] | None = None
        self.master_fd: int | None = None

    def _closed(self) -> bool:
        return self.channel.closed or not self.transport.is_active()

    def resize(self, width: int, height: int) -> None:
        self.pty_size = (width, height)
        if self.master_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.master_fd, termios.TIOCSWINSZ,
                            struct.pack("HHHH", height, width, 0, 0))

    def start(self, argv: list[str]) -> None:
        threading.Thread(target=self._run, args=(argv,), daemon=True,
                         name=f"sim-ssh-{self.endpoint.host.name}").start()

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        host = self.endpoint.host
        cwd = str(host.home) if host.home.is_dir() else "/"
        if self.pty_size is None:
            return subprocess.Popen(argv, cwd=cwd, env=self.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True)
        master, slave = pty.openpty()
        self.master_fd = master
        self.resize(*self.pty_size)

        def ctty() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            return subprocess.Popen(argv, cwd=cwd, env=dict(self.env, TERM=self.env.get(
                "TERM", "xterm")), stdin=slave, stdout=slave, stderr=slave,
                start_new_session=True, close_fds=True, preexec_fn=ctty)
        finally:
            os.close(slave)

    def _run(self, argv: list[str]) -> None:
        chan = self.channel
        try:
            proc = self._spawn(argv)
        except OSError as exc:
            with contextlib.suppress(Exception):
                chan.sendall_stderr(f"sh: cannot start command: {exc}\n".encode())
                chan.send_exit_status(127)
                chan.close()
            return
        self.endpoint.flaky_cut(self.transport)
        if self.master_fd is not None:
            pumps = [threading.Thread(target=self._pump_out, args=(self.master_fd, chan.sendall),
                                      daemon=True),
                     threading.Thread(target=self._pump_in, args=(self.master_fd, None),
                                      daemon=True)]
        else:
            pumps = [threading.Thread(target=self._pump_out,
                                      args=(proc.stdout.fileno(), chan.sendall), daemon=True),
                     threading.Thread(target=self._pump_out,
                                      args=(proc.stderr.fileno(), chan.sendall_stderr),
                                      daemon=True),
                     threading.Thread(target=self._pump_in, args=(None, proc.stdin),
                                      daemon=True)]
        for t in pumps:
            t.start()
        killed = False
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if self._closed():
                    _kill_group(proc)
                    killed = True
                    break
        outs = pumps[:1] if self.master_fd is not None else pumps[:2]
        while any(t.is_alive() for t in outs):
            for t in outs:
                t.join(timeout=0.2)
            if self._closed() and not killed:
                _kill_group(proc)
                killed = True
                break
        if self.master_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.master_fd)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if not self._closed():
            with contextlib.suppress(Exception):
                chan.send_exit_status(_exit_code(proc.returncode))
                chan.shutdown_write()
                chan.close()

    def _pump_out(self, fd: int, send: Callable[[bytes], None]) -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return  # EIO on a pty whose child is gone
            if not data:
                return
            try:
                send(data)
            except Exception:
                return

    def _pump_in(self, master: int | None, stdin) -> None:
        try:
            while True:
                try:
                    data = self.channel.recv(65536)
                except Exception:
                    return
                if not data:
                    return
                try:
                    if master is not None:
                        os.write(master, data)
                    else:
                        stdin.write(data)
                        stdin.flush()
                except OSError:
                    return
        finally:
            if stdin is not None:
                with contextlib.suppress(OSError):
                    stdin.close()


class _ServerIface(paramiko.ServerInterface):
    def __init__(self, endpoint: EmbeddedEndpoint, transport: paramiko.Transport,
                 client: tuple[str, int]):
        self.endpoint = endpoint
        self.transport = transport
        self.client = client
        self.envs: dict[int, dict[str, str]] = {}
        self.sessions: dict[int, _Session] = {}
        self.ptys: dict[int, tuple[int, int]] = {}

    # auth
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_FAILED

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        host = self.endpoint.host
        if username == host.user and key.get_base64() in load_authorized(
                self.endpoint.authorized_keys):
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    # channels
    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_env_request(self, channel, name, value) -> bool:
        name = name.decode() if isinstance(name, bytes) else name
        value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        self.envs.setdefault(channel.get_id(), {})[name] = value
        return True

    def check_channel_pty_request(self, channel, term, width, height, pw, ph, modes) -> bool:
        self.ptys[channel.get_id()] = (max(1, width), max(1, height))
        term = term.decode() if isinstance(term, bytes) else term
        self.envs.setdefault(channel.get_id(), {})["TERM"] = term or "xterm"
        return True

    def check_channel_window_change_request(self, channel, width, height, pw, ph) -> bool:
        session = self.sessions.get(channel.get_id())
        if session is not None:
            session.resize(width, height)
        else:
            self.ptys[channel.get_id()] = (width, height)
        return True

    def _session(self, channel) -> _Session:
        host = self.endpoint.host
        laddr = self.transport.sock.getsockname()
        conn = f"{self.client[0]} {self.client[1]} {laddr[0]} {laddr[1]}"
        env = host.env(self.envs.get(channel.get_id()), conn)
        session = _Session(self.endpoint, self.transport, channel, env)
        session.pty_size = self.ptys.get(channel.get_id())
        self.sessions[channel.get_id()] = session
        return session

    def check_channel_exec_request(self, channel, command) -> bool:
        cmd = command.decode("utf-8", "surrogateescape") if isinstance(command, bytes) \
            else command
        self._session(channel).start(["/bin/sh", "-c", cmd])
        return True

    def check_channel_shell_request(self, channel) -> bool:
        session = self._session(channel)
        session.start(["/bin/sh", "-i"] if session.pty_size else ["/bin/sh"])
        return True

    def check_channel_subsystem_request(self, channel, name) -> bool:
        name = name.decode() if isinstance(name, bytes) else name
        if name != "sftp":
            return False
        return super().check_channel_subsystem_request(channel, name)


class _SFTPHandle(paramiko.SFTPHandle):
    def stat(self):
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)

    def chattr(self, attr):
        try:
            paramiko.SFTPServer.set_file_attr(self.filename, attr)
            return paramiko.sftp.SFTP_OK
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)


class _SFTPIface(paramiko.SFTPServerInterface):
    """Plain SFTP on the real file system (relative paths start at the host's HOME)."""

    def __init__(self, server: _ServerIface, *args, **kwargs):
        super().__init__(server, *args, **kwargs)
        self.home = str(server.endpoint.host.home)

    def _path(self, path: str) -> str:
        return os.path.join(self.home, path) if not path.startswith("/") else path

    def canonicalize(self, path: str) -> str:
        return os.path.normpath(self._path(path or "."))

    def _err(self, exc: OSError) -> int:
        return paramiko.SFTPServer.convert_errno(exc.errno)

    def list_folder(self, path):
        path = self._path(path)
        try:
            out = []
            for name in os.listdir(path):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(path, name)))
                attr.filename = name
                out.append(attr)
            return out
        except OSError as exc:
            return self._err(exc)

    def stat(self, path):
        try:
            return paramiko.SFTPAttributes.from_stat(os.stat(self._path(path)))
        except OSError as exc:
            return self._err(exc)

    def lstat(self, path):
        try:
            return paramiko.SFTPAttributes.from_stat(os.lstat(self._path(path)))
        except OSError as exc:
            return self._err(exc)

    def open(self, path, flags, attr):
        path = self._path(path)
        try:
            mode = getattr(attr, "st_mode", None) or 0o666
            fd = os.open(path, flags | getattr(os, "O_BINARY", 0), stat.S_IMODE(mode))
        except OSError as exc:
            return self._err(exc)
        if flags & os.O_CREAT and attr is not None:
            attr._flags &= ~attr.FLAG_PERMISSIONS
            paramiko.SFTPServer.set_file_attr(path, attr)
        if flags & os.O_WRONLY:
            fstr = "ab" if flags & os.O_APPEND else "wb"
        elif flags & os.O_RDWR:
            fstr = "a+b" if flags & os.O_APPEND else "r+b"
        else:
            fstr = "rb"
        try:
            f = os.fdopen(fd, fstr)
        except OSError as exc:
            return self._err(exc)
        handle = _SFTPHandle(flags)
        handle.filename = path
        handle.readfile = f
        handle.writefile = f
        return handle

    def remove(self, path):
        try:
            os.remove(self._path(path))
        except OSError as exc:
            return self._err(exc)
        return paramiko.sftp.SFTP_OK

    def rename(self, oldpath, newpath):
        try:
            os.rename(self._path(oldpath), self._path(newpath))
        except OSError as exc:
            return self._err(exc)
        return paramiko.sftp.SFTP_OK

    def posix_rename(self, oldpath, newpath):
        return self.rename(oldpath, newpath)

    def mkdir(self, path, attr):
        try:
            os.mkdir(self._path(path))
            if attr is not None:
                paramiko.SFTPServer.set_file_attr(self._path(path), attr)
        except OSError as exc:
            return self._err(exc)
        return paramiko.sftp.SFTP_OK

    def rmdir(self, path):
        try:
            os.rmdir(self._path(path))
        except OSError as exc:
            return self._err(exc)
        return paramiko.sftp.SFTP_OK

    def chattr(self, path, attr):
        try:
            paramiko.SFTPServer.set_file_attr(self._path(path), attr)
        except OSError as exc:
            return self._err(exc)
        return paramiko.sftp.SFTP_OK

    def symlink(self, target_path, path):
        try:
            os.symlink(target_path, self._path(path))
        except OSError as exc:
            return self._err(exc)
        return paramiko.sftp.SFTP_OK

    def readlink(self, path):
        try:
            return os.readlink(self._path(path))
        except OSError as exc:
            return self._err(exc)


class EmbeddedEndpoint:
    """A paramiko SSH server for one simulated host (see the module docstring)."""

    def __init__(self, host: SimHost, authorized_keys: Path, flaky: FlakyFn):
        self.host = host
        self.authorized_keys = authorized_keys
        self.flaky = flaky
        self.host_key = paramiko.Ed25519Key.from_private_key_file(str(host.key_path))
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._transports: set[paramiko.Transport] = set()

    @property
    def up(self) -> bool:
        return self._sock is not None

    def start(self) -> None:
        with self._lock:
            if self._sock is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            deadline = time.monotonic() + 5
            while True:
                try:
                    sock.bind((self.host.address, self.host.port))
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                        sock.close()
                        raise
                    time.sleep(0.05)
            sock.listen(64)
            self.host.port = sock.getsockname()[1]
            self._sock = sock
        threading.Thread(target=self._accept_loop, args=(sock,), daemon=True,
                         name=f"sim-listen-{self.host.name}").start()

    def stop(self) -> None:
        """Refuse new connections and drop every live session (their commands get killed)."""
        with self._lock:
            sock, self._sock = self._sock, None
            transports = list(self._transports)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for t in transports:
            with contextlib.suppress(Exception):
                t.close()

    close = stop

    def flaky_cut(self, transport: paramiko.Transport) -> None:
        """With ssh-flaky on, maybe schedule this connection to be cut within a while."""
        params = self.flaky()
        if params is None:
            return
        rate, within = params
        if random.random() < rate:
            timer = threading.Timer(random.uniform(0.0, within), transport.close)
            timer.daemon = True
            timer.start()

    def _accept_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, addr = sock.accept()
            except OSError:
                return
            if self._sock is not sock:
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                             name=f"sim-conn-{self.host.name}").start()

    def _serve(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, _SFTPIface)
        iface = _ServerIface(self, transport, addr)
        with self._lock:
            if self._sock is None:
                conn.close()
                return
            self._transports.add(transport)
        try:
            transport.start_server(server=iface)
            params = self.flaky()
            if params is not None and random.random() < params[0] / 2:
                transport.close()  # cut right after the handshake
            # paramiko keeps channels in a WeakValueDictionary: hold every accepted channel
            # here, or one could be garbage-collected (and closed) before its exec request
            channels: set[paramiko.Channel] = set()
            while transport.is_active():
                chan = transport.accept(timeout=1.0)
                if chan is not None:
                    channels.add(chan)
                channels = {c for c in channels if not c.closed}
        except (paramiko.SSHException, EOFError, OSError) as exc:
            log.debug("%s: connection from %s ended: %s", self.host.name, addr, exc)
        finally:
            with contextlib.suppress(Exception):
                transport.close()
            with self._lock:
                self._transports.discard(transport)


# ------------------------------------------------------------------------------- OpenSSH


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def sshd_path() -> str | None:
    for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd", shutil.which("sshd")):
        if p and os.path.exists(p):
            return p
    return None


def _sftp_server() -> str | None:
    for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
              "/usr/libexec/sftp-server", "/usr/lib/ssh/sftp-server"):
        if os.path.exists(p):
            return p
    return None


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


class OpenSSHEndpoint:
    """A real OpenSSH sshd for one simulated host (see the module docstring)."""

    def __init__(self, host: SimHost, authorized_keys: Path):
        self.host = host
        self.authorized_keys = authorized_keys
        self.proc: subprocess.Popen | None = None
        self.dir = host.host_dir
        self.config = self.dir / "sshd_config"
        self.wrapper = self.dir / "session.sh"
        self.flaky_file = self.dir / "ssh-flaky"
        self.logfile = self.dir / "sshd.log"

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _write_files(self) -> None:
        env = self.host.base_env()
        lines = ["#!/bin/sh", "# generated by the orchestrator simulator: session of "
                 f"{self.host.name}"]
        for key, value in env.items():
            if key == "PYTHONPATH":
                lines.append(f'PYTHONPATH={_sh_quote(value)}"${{PYTHONPATH:+:$PYTHONPATH}}"')
            else:
                lines.append(f"{key}={_sh_quote(value)}")
            lines.append(f"export {key}")
        lines += [
            f'if [ -f {_sh_quote(str(self.flaky_file))} ]; then',
            f'  read -r rate within < {_sh_quote(str(self.flaky_file))}',
            '  delay=$(awk -v r="$rate" -v w="$within" -v s="$$" '
            '\'BEGIN { srand(s + systime()); if (rand() < r) printf "%.2f", rand() * w }\')',
            '  if [ -n "$delay" ]; then',
            '    sshpid=$PPID',
            '    while [ "$sshpid" -gt 1 ] &&',
            '          [ "$(cat /proc/$sshpid/comm 2>/dev/null)" != sshd ]; do',
            '      sshpid=$(awk \'{print $4}\' /proc/$sshpid/stat 2>/dev/null || echo 1)',
            '    done',
            '    [ "$sshpid" -gt 1 ] || delay=""',
            '    [ -z "$delay" ] ||',
            '      ( sleep "$delay"; kill -9 "$sshpid" ) >/dev/null 2>&1 </dev/null &',
            '  fi',
            'fi',
            'cd "$HOME" 2>/dev/null || cd /',
            'if [ -n "$SSH_ORIGINAL_COMMAND" ]; then',
            '  exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"',
            'fi',
            'exec /bin/sh -i',
        ]
        self.wrapper.write_text("\n".join(lines) + "\n")
        self.wrapper.chmod(0o755)
        sftp = _sftp_server()
        config = [
            f"ListenAddress {self.host.address}:{self.host.port}",
            f"HostKey {self.host.key_path}",
            f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            f"AllowUsers {self.host.user}",
            "PermitRootLogin prohibit-password",
            "AcceptEnv *",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "PrintMotd no",
            "ClientAliveInterval 15",
            "LogLevel ERROR",
            # sshd runs the ForceCommand as `$SHELL -c CMD` with the login shell and home of
            # the user in THIS machine's passwd (openssh-portable V_9_2_P1 session.c:1709-1713),
            # i.e. the simulator's own /root and /bin/bash; bash sources ~/.bashrc for an sshd
            # child only while SHLVL is below 1 (bash-5.2 shell.c:1137-1147, SHLVL + 1 in
            # variables.c:851-899), so SHLVL=1 (sshd_config SetEnv, OpenSSH >= 7.8, applied in
            # session.c:1153-1162) keeps the developer's ~/.bashrc (pyenv init: ~120 ms of CPU
            # per session here) out of every simulated host's sessions. The simulated host has
            # its own HOME, set by the wrapper.
            "SetEnv SHLVL=1",
            f"ForceCommand {self.wrapper}",
        ]
        if sftp:
            config.append(f"Subsystem sftp {sftp}")
        self.config.write_text("\n".join(config) + "\n")

    def start(self) -> None:
        if self.up:
            return
        exe = sshd_path()
        if exe is None:
            raise RuntimeError("OpenSSH sshd not found (looked in /usr/sbin, /usr/local/sbin, "
                               "PATH): install openssh-server or use --sshd embedded")
        if not self.host.port:
            self.host.port = _free_port(self.host.address)
        self._write_files()
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIM_")}
        self.proc = subprocess.Popen(
            [exe, "-D", "-f", str(self.config), "-E", str(self.logfile)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.host.name} exited at start (code "
                                   f"{self.proc.returncode}); see {self.logfile}")
            try:
                with socket.create_connection((self.host.address, self.host.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd for {self.host.name} did not listen on "
                           f"{self.host.address}:{self.host.port}; see {self.logfile}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        procs.kill_tree(proc.pid)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)

    close = stop

    def set_flaky(self, params: tuple[float, float] | None) -> None:
        if params is None:
            with contextlib.suppress(FileNotFoundError):
                self.flaky_file.unlink()
        else:
            self.flaky_file.write_text(f"{params[0]} {params[1]}\n")
