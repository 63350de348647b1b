"""Network probes run ON the host (stdlib only, Python 3.8+): can this host reach ADDRESS:PORT?

Used before a multi-node SGLang launch: every node must reach node 0's --dist-init-addr (where
torch.distributed's store listens), and node 0 must own that address.
"""
from __future__ import annotations

import errno
import socket
import time

from orchestrator.remote.probes import probe


def _local(address: str) -> bool | None:
    """True when `address` is one of this host's (a bind to it succeeds); None if unknown."""
    try:
        infos = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind((sockaddr[0], 0) + tuple(sockaddr[2:]))
                return True
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    return None
    return False


@probe("tcp_port")
def tcp_port(address: str, port: int, timeout: float = 3.0) -> dict:
    """One TCP connect from this host to address:port; never raises.

    Returns {"reach": "open" (accepted) | "refused" (the host answered: nothing listens) |
    "timeout" (filtered or down) | "unreachable" | "unresolved" | "error", "error": text or None,
    "local": whether the address is this host's own (None when that cannot be told),
    "elapsed": seconds}. "open" and "refused" both mean the host and port are reachable.
    """
    t0 = time.monotonic()
    out = {"reach": "open", "error": None, "local": _local(address), "elapsed": 0.0}
    try:
        with socket.create_connection((address, int(port)), timeout=float(timeout)):
            pass
    except ConnectionRefusedError as exc:
        out.update(reach="refused", error=str(exc))
    except socket.timeout as exc:  # noqa: UP041 - Python 3.8 on the host
        out.update(reach="timeout", error=str(exc) or "timed out")
    except socket.gaierror as exc:
        out.update(reach="unresolved", error=str(exc))
    except OSError as exc:
        unreachable = exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
        out.update(reach="unreachable" if unreachable else "error", error=str(exc))
    out["elapsed"] = round(time.monotonic() - t0, 4)
    return out
