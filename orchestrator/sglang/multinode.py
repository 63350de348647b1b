"""Multi-node tensor parallelism: one SGLang server over several boxes (pure; no host).

The same command runs on every node with `--nnodes N --node-rank R --dist-init-addr HOST:PORT`
(HOST:PORT on node 0, identical everywhere). What real SGLang does with it (paths relative to
sglang/srt/ of the wheel of each release):

* Every rank initialises torch.distributed at `tcp://DIST_INIT_ADDR` before loading weights and
  waits for the whole world (tp x pp ranks) until --dist-timeout (None: torch's 30-minute
  default): model_executor/model_runner.py:776-777, :803-811 (0.5.9); distributed/bootstrap.py
  :241-243, :321-329 (0.5.23). Node 0 serves that store; the others must reach HOST:PORT.
* Only node 0 runs the tokenizer and the HTTP API; a node rank >= 1 runs its schedulers and a
  dummy health server on --host/--port whose /health, /health_generate and /ping always answer
  200: entrypoints/engine.py:1040-1061 (0.5.9), :1234-1290 (0.5.23); utils/common.py:2656-2712
  (0.5.9), :3624-3685 (0.5.23); entrypoints/http_server.py:3163-3165 (0.5.23). Readiness is
  therefore proven on node 0 only (its /health runs a generation through every rank).
* One rank dying ends the group: the schedulers broadcast the received requests over the TP
  CPU group every loop (managers/scheduler.py:1301-1306 (0.5.9);
  managers/scheduler_components/request_receiver.py:206-211 (0.5.23)); a dead peer makes it
  raise, the scheduler sends SIGQUIT to its parent (scheduler.py:3188-3191 (0.5.9), :6370-6373
  (0.5.23)) which kills its process tree (entrypoints/engine.py:864-874 (0.5.9), :1972-1982
  (0.5.23)). So after one box reboots the whole group must be launched again.
* 0.5.23: a node rank >= 1 ignores SIGTERM and waits for rank 0's shutdown broadcast; the
  caller's SIGKILL after its grace is the backstop (entrypoints/engine.py:1259-1271 (0.5.23)).
* `tp_size * pp_size % nnodes == 0` (rules/serving.py), and each node uses tp x pp / nnodes GPUs
  from --base-gpu-id (entrypoints/engine.py:925-945 (0.5.9), :2045-2083 (0.5.23)).

The group is a stage parameter: `nodes`, the inventory names in rank order (`"{{ groups.gpu }}"`);
a host's rank is its place in that list, node 0's address its inventory address (or
`dist_init_addr`, e.g. on a separate interconnect network).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import StageError

DEFAULT_DIST_INIT_PORT = 20000


@dataclass(frozen=True)
class NodeGroup:
    """This host's place in a multi-node group: the nodes (rank order), its rank, node 0's
    HOST:PORT and the distributed init timeout."""

    nodes: tuple[str, ...]
    rank: int
    dist_init_addr: str
    dist_timeout: int | None = None

    @property
    def nnodes(self) -> int:
        """How many nodes the group spans."""
        return len(self.nodes)

    @property
    def leader(self) -> bool:
        """Node rank 0: serves the API (and torch.distributed's store)."""
        return self.rank == 0

    @property
    def leader_address(self) -> tuple[str, int]:
        """Node 0's (host, port) for torch.distributed."""
        return split_addr(self.dist_init_addr)

    def args(self) -> list[str]:
        """The launch flags of this node (full names, as build_args writes flags)."""
        out = ["--nnodes", str(self.nnodes), "--node-rank", str(self.rank),
               "--dist-init-addr", self.dist_init_addr]
        if self.dist_timeout is not None:
            out += ["--dist-timeout", str(self.dist_timeout)]
        return out


def split_addr(addr: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); StageError when it is not that."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StageError(f"dist_init_addr {addr!r} is not HOST:PORT",
                         hint="write node 0's address and a free port, e.g. 10.0.0.21:20000")
    return host.strip("[]"), int(port)


def join_addr(host: str, port: int) -> str:
    """(host, port) -> "host:port" ("[v6]:port" for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def node_group(nodes: Sequence[str], host_name: str, inventory_hosts: Mapping[str, Any], *,
               dist_init_addr: str | None = None, dist_init_port: int = DEFAULT_DIST_INIT_PORT,
               dist_timeout: int | None = None) -> NodeGroup | None:
    """This host's group, or None for a single-node server (`nodes` empty or one name)."""
    names = [str(n) for n in nodes]
    if len(names) <= 1:
        return None
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StageError(f"nodes lists {', '.join(twice)} more than once: {names}",
                         hint="one inventory host per node rank")
    if host_name not in names:
        raise StageError(f"host {host_name!r} is not one of the group's nodes {names}",
                         hint="run the playbook on the group's hosts only (hosts: GROUP) or "
                         "fix `nodes`")
    if dist_init_addr:
        split_addr(dist_init_addr)
        addr = dist_init_addr
    else:
        spec = inventory_hosts.get(names[0])
        address = getattr(spec, "address", None) or names[0]
        addr = join_addr(str(address), dist_init_port)
    return NodeGroup(tuple(names), names.index(host_name), addr, dist_timeout)


def reach_problem(group: NodeGroup, reach: str, local: bool | None, error: str | None) -> \
        str | None:
    """Why the launch cannot form the group, from a TCP connect to node 0's HOST:PORT made on
    this host (facts.network.TcpPort), or None.

    Node 0 must own the address (torch's store binds there); the others must get an answer
    from it (accepted, or refused while node 0 is not started yet): a timeout or an unreachable
    network leaves the group waiting out --dist-timeout (30 minutes by default).
    """
    where = group.dist_init_addr
    if group.leader:
        if local is False:
            return (f"dist_init_addr {where} is not an address of this host (node rank 0): "
                    "torch.distributed's store listens on node 0; use node 0's own address")
        return None
    if reach in ("open", "refused"):
        return None
    return (f"node rank {group.rank} cannot reach node 0's dist-init address {where} "
            f"({reach}: {error or 'no answer'}): the group would wait out the distributed "
            "timeout. Open that port between the boxes (firewall, routes) or set "
            "dist_init_addr to an address node 0 has on a network both reach")
