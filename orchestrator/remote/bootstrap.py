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
    code = compile(s, "orchestrator/remote/agent.py", "exec")
    exec(code, {"__name__": "__orchestrator_agent__", "AGENT_SOURCE": s})


if __name__ == "__main__":
    main()
