#!/usr/bin/env python3
"""Per-command overhead on a loopback sshd: our agent channel vs one SSH exec channel per command.

    .venv/bin/python scripts/bench_transport.py [--agent-commands 300] [--exec-commands 40]

Starts a real OpenSSH sshd on 127.0.0.1 (needs root and openssh-server, like the tests), then
times the trivial command `true`:
  (a) SSHTransport.run: one message on the agent's long-lived channel per command;
  (b) fabric Connection.run: a new exec channel per command (what Fabric/invoke do).
Both use an already-open SSH connection, so only the per-command cost is measured. Prints
ms/command for each and the ratio, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import paramiko  # noqa: E402
from fabric import Connection  # noqa: E402

from orchestrator.transports.ssh import SSHTransport  # noqa: E402
from tests.sshd import SSHDFactory, sshd_unavailable  # noqa: E402


def _time_per_call(fn, n: int) -> float:  # noqa: ANN001 - tiny helper
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-commands", type=int, default=300)
    parser.add_argument("--exec-commands", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="median of this many rounds")
    args = parser.parse_args()
    reason = sshd_unavailable()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        factory = SSHDFactory(Path(tmp))
        try:
            server = factory("127.0.0.1")
            spec = server.host_spec(name="bench")
            transport = SSHTransport(spec)
            transport.connect()
            conn = Connection(server.address, user=server.user, port=server.port,
                              connect_kwargs={"key_filename": [server.identity_file],
                                              "look_for_keys": False})
            conn.client.load_host_keys(spec.known_hosts or "")
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
            conn.open()
            for _ in range(5):  # warm up both paths
                transport.run("true")
                conn.run("true", hide=True)
            agent_ms, exec_ms = [], []
            for _ in range(args.rounds):
                agent_ms.append(_time_per_call(lambda: transport.run("true"),
                                               args.agent_commands))
                exec_ms.append(_time_per_call(lambda: conn.run("true", hide=True),
                                              args.exec_commands))
            a, e = statistics.median(agent_ms), statistics.median(exec_ms)
            print(f"loopback sshd, command `true`, median of {args.rounds} rounds")
            print(f"  (a) agent channel (SSHTransport.run): {a:8.2f} ms/command "
                  f"({args.agent_commands} commands/round)")
            print(f"  (b) exec channel per command (fabric Connection.run): {e:8.2f} ms/command "
                  f"({args.exec_commands} commands/round)")
            print(f"  ratio (b)/(a): {e / a:.1f}x")
            transport.close()
            conn.close()
        finally:
            factory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
