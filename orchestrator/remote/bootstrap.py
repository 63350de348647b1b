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
    exec(compiled(s), {"__name__": "__orchestrator_agent__", "AGENT_SOURCE": s})


def compiled(s):
    # type: (bytes) -> object
    """The agent source S compiled, kept marshalled in ~/.cache/orchestrator-agent/ under the
    key agent.cached_compile uses (the source and this Python bytecode magic): a host compiles
    each agent version once, not at every connection. Any problem with the cache: compile."""
    import hashlib
    import marshal
    import tempfile
    from importlib.util import MAGIC_NUMBER

    name = "orchestrator/remote/agent.py"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(MAGIC_NUMBER + name.encode() + s).hexdigest()[:32]
    path = os.path.join(base, "orchestrator-agent", key + ".code")
    try:
        with open(path, "rb") as fh:
            return marshal.loads(fh.read())
    except Exception:  # noqa: BLE001 - absent, unreadable, truncated
        pass
    code = compile(s, name, "exec")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(marshal.dumps(code))
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - a read-only home: no cache
        pass
    return code


if __name__ == "__main__":
    main()
