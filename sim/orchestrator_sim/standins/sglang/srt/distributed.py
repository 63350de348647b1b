"""Multi-node groups of the stand-in: the rendezvous at --dist-init-addr and the group's link.

Real SGLang (paths relative to sglang/srt/):

* Every rank initialises torch.distributed with `tcp://DIST_INIT_ADDR` before loading weights
  (model_executor/model_runner.py:776-777 and :803-811 (0.5.9); distributed/bootstrap.py:241-243
  and :321-329 (0.5.23)), world size tp x pp, bounded by --dist-timeout (None: torch's default
  of 30 minutes). Rank 0 of the world (node 0) serves the store on that port; the others connect
  to it and everyone waits until the whole world joined.
* A node rank >= 1 runs only schedulers: no tokenizer, no API; once its schedulers are ready it
  serves a dummy health server on --host/--port (/ping, /health, /health_generate: always 200)
  and blocks until its schedulers exit (entrypoints/engine.py:1040-1061 (0.5.9), :1234-1290
  (0.5.23); utils/common.py:2656-2700 (0.5.9), :3624-3685 (0.5.23); entrypoints/http_server.py
  :3163-3165 (0.5.23)).
* The schedulers of all ranks exchange the received requests every loop over the TP CPU group
  (managers/scheduler.py:1301-1306 (0.5.9); managers/scheduler_components/request_receiver.py
  :206-211 (0.5.23)). When a peer is gone that broadcast raises; the scheduler logs "Scheduler
  hit an exception" and sends SIGQUIT to its parent (scheduler.py:3188-3191 (0.5.9), :6370-6373
  (0.5.23)), whose handler kills the whole process tree (entrypoints/engine.py:864-874 (0.5.9),
  :1972-1982 (0.5.23)). So one rank dying ends every rank of the group.
* 0.5.23: a node rank >= 1 ignores SIGTERM ("waiting for the rank-0 ShutdownReq broadcast"):
  rank 0 stops every rank; the caller's kill timeout is the backstop (entrypoints/engine.py
  :1259-1271 (0.5.23); absent in 0.5.20).

The simulator's simplifications: the simulated hosts share one kernel, so rank 0 binds the store
on the dist-init ADDRESS (torch binds every interface); a rank that reaches a store whose group
is already complete (an old rank 0 not yet stopped) is turned away and tries again until the
timeout. The link is one TCP connection per rank >= 1 to rank 0, kept for the life of the group.
The timeout is wall-clock time, not scaled by the simulator's time scale.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import threading
import time

from sglang.srt import hardware
from sglang.srt.utils import log

DEFAULT_TIMEOUT = 1800.0  # torch.distributed's default process-group timeout (30 minutes)


class Stopped(Exception):
    """SIGTERM/SIGINT while waiting for the other ranks."""


def split_addr(addr: str) -> tuple:
    """"host:port" (or "[v6]:port") -> (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _die(reason: str) -> None:
    """A peer is gone: the scheduler's exception, SIGQUIT to the parent, kill_process_tree."""
    log(f"Scheduler hit an exception: Traceback (most recent call last):\n"
        f"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] {reason}", "TP0")
    log("Received sigquit from a child process. It usually means the child failed.")
    hardware.release()
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(sock: socket.socket, who: str) -> None:
    """End this rank when the link to `who` closes (a peer died, its box rebooted)."""
    def run() -> None:
        try:
            while sock.recv(64):
                pass
        except OSError:
            pass
        _die(f"Connection closed by peer [{who}]")

    threading.Thread(target=run, name="group-link", daemon=True).start()


class Group:
    """One node's side of a multi-node group (nnodes > 1 with --dist-init-addr)."""

    def __init__(self, server_args, stop: threading.Event) -> None:
        self.args = server_args
        self.stop = stop
        self.nnodes = int(server_args.nnodes)
        self.rank = int(server_args.node_rank)
        self.addr = str(server_args.dist_init_addr)
        self.timeout = float(getattr(server_args, "dist_timeout", None) or DEFAULT_TIMEOUT)
        self.links: list = []

    def _deadline(self) -> float:
        # NOT time-scaled: the other nodes are started by their deployer in real time (a
        # scaled 30 minutes, 1.8 s at 1/1000, would end a group whose second box is slower)
        return time.monotonic() + self.timeout

    def _timed_out(self) -> RuntimeError:
        return RuntimeError(
            f"torch.distributed init timed out after {self.timeout:.0f}s: "
            f"{self.nnodes} nodes expected at tcp://{self.addr} (world size "
            f"{self.args.tp_size * self.args.pp_size})")

    def join(self) -> None:
        """Wait until every node joined (rank 0 serves the store; the others connect)."""
        log(f"Init torch distributed begin. nnodes={self.nnodes} node_rank={self.rank} "
            f"dist_init_addr={self.addr}", "TP0")
        if self.rank == 0:
            self._serve()
        else:
            self._connect()
        log("Init torch distributed ends.", "TP0")

    # -------------------------------------------------------------- rank 0
    def _serve(self) -> None:
        host, port = split_addr(self.addr)
        srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((host, port))
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, "")
            raise RuntimeError(
                "The server socket has failed to listen on any local network address. "
                f"port: {port}, useIpv6: 0, code: -{exc.errno}, name: {name}, "
                f"message: {exc.strerror}") from None
        srv.listen(64)
        srv.settimeout(0.05)  # accept() wakes to see SIGTERM
        self.listener = srv
        joined: dict = {}
        deadline = self._deadline()
        while len(joined) < self.nnodes - 1:
            if self.stop.is_set():
                raise Stopped()
            if time.monotonic() > deadline:
                raise self._timed_out()
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            rank = self._hello(conn)
            if rank is None or rank in joined or not 0 < rank < self.nnodes:
                conn.close()
                continue
            joined[rank] = conn
        for rank, conn in sorted(joined.items()):
            conn.sendall(b"go\n")
            _watch(conn, f"node_rank {rank}")
            self.links.append(conn)
        threading.Thread(target=self._turn_away, name="store", daemon=True).start()

    @staticmethod
    def _hello(conn: socket.socket):
        conn.settimeout(2.0)
        try:
            line = conn.makefile("rb").readline()
            rank = int(json.loads(line.decode())["node_rank"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        conn.settimeout(None)
        return rank

    def _await_go(self, sock: socket.socket, hello: bytes, deadline: float) -> bytes:
        """Send our rank; read rank 0's answer ("go" once every node joined; b"" if closed)."""
        buf = b""
        try:
            sock.sendall(hello)
            sock.settimeout(0.1)
            while not buf.endswith(b"\n"):
                if self.stop.is_set():
                    raise Stopped()
                if time.monotonic() > deadline:
                    raise self._timed_out()
                try:
                    chunk = sock.recv(16)
                except TimeoutError:
                    continue
                if not chunk:
                    return b""
                buf += chunk
        except OSError:
            return b""
        return buf.strip()

    def _turn_away(self) -> None:
        """The group is complete: a late rank is answered and closed (it retries elsewhere)."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()

    # -------------------------------------------------------------- rank >= 1
    def _connect(self) -> None:
        host, port = split_addr(self.addr)
        deadline = self._deadline()
        hello = json.dumps({"node_rank": self.rank}).encode() + b"\n"
        while True:
            if self.stop.is_set():
                raise Stopped()
            if time.monotonic() > deadline:
                raise self._timed_out()
            try:
                sock = socket.create_connection((host, port), timeout=1.0)
            except OSError:
                self.stop.wait(0.05)
                continue
            answer = self._await_go(sock, hello, deadline)
            if answer == b"go":
                sock.settimeout(None)
                _watch(sock, f"node_rank 0 at {self.addr}")
                self.links.append(sock)
                return
            sock.close()
            self.stop.wait(0.05)
