"""How long after exec the first SSH connection starts: runs `orchestrator ARGS` in this process
with an audit hook on socket.connect (PEP 578) and prints, on stderr, the seconds from the
moment given in $ORCH_T0 (the caller's clock before it started us, `time.time()`) to the
first connect() to a non-loopback-HTTP port, i.e. the first SSH handshake.

    ORCH_T0=$(python3 -c 'import time; print(time.time())') \\
        .venv/bin/python scripts/first_connect.py deploy PLAYBOOK -i INVENTORY
"""

from __future__ import annotations

import os
import sys
import time

T0 = float(os.environ.get("ORCH_T0") or time.time())
_seen: list[float] = []


def _hook(event: str, args: tuple) -> None:
    if event == "socket.connect" and not _seen:
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2:
            _seen.append(time.time() - T0)
            sys.stderr.write(f"first-connect-s {_seen[0]:.3f} {address[0]}:{address[1]}\n")


if __name__ == "__main__":
    sys.addaudithook(_hook)
    from orchestrator.cli.main import entry

    sys.argv[0] = "orchestrator"
    entry()
