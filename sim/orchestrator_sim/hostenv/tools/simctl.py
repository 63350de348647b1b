"""Client of the simulator daemon's control channel (JSON lines over loopback TCP), stdlib only.

Used by the host tools (pct, ...) through the SIM_CONTROL environment variable
("HOST:PORT:TOKEN") and by the `orchestrator sim` commands through SIMDIR/sim.json.
"""

# ruff: noqa: UP031  (host-side code keeps printf-style formatting for its tables)

from __future__ import annotations

import json
import os
import socket


class ControlError(Exception):
    """The daemon could not be reached or refused the request."""


def from_env() -> tuple:
    value = os.environ.get("SIM_CONTROL", "")
    host, _, rest = value.partition(":")
    port, _, token = rest.partition(":")
    if not (host and port and token):
        raise ControlError("SIM_CONTROL is not set: not running on a simulated host")
    return host, int(port), token


def request(address: tuple, token: str, op: str, timeout: float = 120.0, **args) -> dict:
    """Send one request; return the daemon's answer (a dict with "ok")."""
    msg = dict(args, op=op, token=token)
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.sendall(json.dumps(msg).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
    except OSError as exc:
        raise ControlError("cannot reach the simulator daemon at %s:%d: %s"
                           % (address[0], address[1], exc)) from None
    if not buf:
        raise ControlError("the simulator daemon closed the control connection without answering")
    return json.loads(buf.decode())
