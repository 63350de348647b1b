"""The agent bootstrap: the program given to `python3 -c` that starts the agent on the host.

Its text is the whole command (`PYTHON -c TEXT`): over SSH through the login shell, locally,
and by the agent itself for its root helper (`sudo -n -- PYTHON -c TEXT`). It runs on any Python
(so its hints are type comments), says so on one older than 3.8 (exit code 3), then reads the
agent source from fd 0 unbuffered (so no frame bytes are swallowed by a buffer: 10 ASCII digits
of length, then the source; exit code 4 when it does not come) and executes it as
`__orchestrator_agent__` with the source in `AGENT_SOURCE`. Kept free of single quotes and
exclamation marks: the text travels inside shell quotes.
"""

import os
import sys

EXIT_OLD_PYTHON = 3
EXIT_NO_SOURCE = 4


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
    """The agent source S compiled (code, True), or read back (code, False) from
    ~/.cache/orchestrator-agent/, where the agent keeps the code it was handed fresh
    (agent._cache_path: the source and this Python bytecode magic): a host compiles each
    agent version once, not at every connection."""
    import marshal
    from importlib.util import MAGIC_NUMBER

    name = "orchestrator/remote/agent.py"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = sha256_hex(MAGIC_NUMBER + name.encode() + s)[:32]
    try:
        with open(os.path.join(base, "orchestrator-agent", key + ".code"), "rb") as fh:
            return marshal.loads(fh.read()), False
    except Exception:  # noqa: BLE001 - absent, unreadable, truncated
        return compile(s, name, "exec"), True


if __name__ == "__main__":
    main()
