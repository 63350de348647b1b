"""The agent bootstrap: the program given to `python3 -c` that starts the agent on the host.

Its text is the whole command (`PYTHON -c TEXT`): over SSH through the login shell, locally,
and by the agent itself for its root helper (`sudo -n -- PYTHON -c TEXT`). It runs on any Python
(so its hints are type comments), says so on one older than 3.8 (exit code 3), then reads the
agent source from fd 0 unbuffered (so no frame bytes are swallowed by a buffer: 10 ASCII digits
of length, then the source; exit code 4 when it does not come) and executes it as
`__orchestrator_agent__` with the source in `AGENT_SOURCE`, compiled or read back from the
code cache the agent keeps (`cache_read`; the agent imports this module, shipped with it, for
the place and checks of the cache). Kept free of single quotes and exclamation marks: the text
travels inside shell quotes.
"""

import os
import sys

EXIT_OLD_PYTHON = 3
EXIT_NO_SOURCE = 4
AGENT_FILE = "orchestrator/remote/agent.py"
NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)


def read_exact(n):
    # type: (int) -> bytes
    """N bytes from fd 0; exit EXIT_NO_SOURCE when it closes first."""
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            sys.exit(EXIT_NO_SOURCE)
        b += c
    return b


def main():
    # type: () -> None
    """Check the Python version, read the agent source from fd 0, run it."""
    if sys.version_info < (3, 8):  # noqa: UP036 - this runs on any Python
        v = sys.version.split()[0]
        sys.stderr.write("orchestrator: the agent needs Python >= 3.8 on the host, found "
                         + v + "\n")
        sys.exit(EXIT_OLD_PYTHON)
    s = read_exact(int(read_exact(10)))
    code, fresh = compiled(s)
    exec(code, {"__name__": "__orchestrator_agent__", "AGENT_SOURCE": s,
                "AGENT_CODE": code if fresh else None})


def sha256_hex(data):
    # type: (bytes) -> str
    """The SHA-256 of DATA, hex, from the module built into the interpreter (_sha256, or
    _sha2 from 3.12): importing hashlib first loads OpenSSL (CPython 3.11 Lib/hashlib.py:169-170
    imports _hashlib), 2-3 ms of every agent start for a cache key. hashlib where neither is."""
    try:
        from _sha256 import sha256
    except ImportError:
        try:
            from _sha2 import sha256
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()


def compiled(s):
    # type: (bytes) -> tuple
    """The agent source S compiled (code, True), or read back (code, False) from the cache the
    agent keeps (cache_read): a host compiles each agent version once, not at each connection."""
    code = cache_read(s, AGENT_FILE)
    return (compile(s, AGENT_FILE, "exec"), True) if code is None else (code, False)


def cache_path(source, name):
    # type: (bytes, str) -> str
    """Where the code of SOURCE (the file NAME) is kept: ~/.cache/orchestrator-agent/KEY.code,
    KEY from the source, NAME and this Python bytecode magic. ~ is the effective uid home in
    the password database, never $HOME; $XDG_CACHE_HOME moves it, except in a process sudo
    started (a root helper): sudo sets SUDO_UID always but may keep the user $HOME and
    $XDG_CACHE_HOME (env_keep), and the helper keeps its own cache. sudo, plugins/sudoers/env.c
    rebuild_env(): the block Add the SUDO_USER, SUDO_UID, SUDO_GID environment variables runs
    unconditionally; HOME is set to the target user only if reset_home."""
    import pwd
    from importlib.util import MAGIC_NUMBER

    base = os.environ.get("XDG_CACHE_HOME")
    if not base or "SUDO_UID" in os.environ:
        base = os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache")
    key = sha256_hex(MAGIC_NUMBER + name.encode() + source)[:32]
    return os.path.join(base, "orchestrator-agent", key + ".code")


def owned(fd):
    # type: (int) -> int
    """FD when its file is owned by the effective uid and writable by no other; else FD is
    closed and OSError raised: code another user could have written never runs."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
        return fd
    os.close(fd)
    raise OSError("owned by another user, or writable by others")


def open_cache_dir(path):
    # type: (str) -> int
    """The directory of the cache entry PATH, opened (never through a symlink) when owned."""
    return owned(os.open(os.path.dirname(path), NOFOLLOW | getattr(os, "O_DIRECTORY", 0)))


def cache_read(source, name):
    # type: (bytes, str) -> object
    """The code of SOURCE kept at cache_path, or None: absent, damaged, a symlink, or in a
    directory or a file that is not owned (owned)."""
    import marshal

    try:
        path = cache_path(source, name)
        d = open_cache_dir(path)
        try:
            fd = owned(os.open(os.path.basename(path), NOFOLLOW, dir_fd=d))
        finally:
            os.close(d)
        with os.fdopen(fd, "rb") as fh:
            return marshal.loads(fh.read())
    except Exception:  # noqa: BLE001 - absent, unreadable, truncated, not ours
        return None


if __name__ == "__main__":
    main()
