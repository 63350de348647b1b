"""Multi-node groups (orchestrator.sglang.multinode): rank, flags and the dist-init check, from
tables; and the `groups` built-in that names a group's hosts in playbooks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.config.loader import load_inventory
from orchestrator.config.variables import builtin_variables
from orchestrator.errors import StageError
from orchestrator.sglang.multinode import node_group, reach_problem

HOSTS = {"gpu-a": SimpleNamespace(address="10.0.0.21"),
         "gpu-b": SimpleNamespace(address="10.0.0.22"),
         "v6": SimpleNamespace(address="fd00::1")}


def test_rank_is_the_place_in_nodes_and_node0_address_is_the_dist_init_host() -> None:
    g = node_group(["gpu-a", "gpu-b"], "gpu-b", HOSTS)
    assert g is not None and g.rank == 1 and not g.leader and g.nnodes == 2
    assert g.args() == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr",
                        "10.0.0.21:20000"]
    g0 = node_group(["gpu-a", "gpu-b"], "gpu-a", HOSTS, dist_init_port=29500, dist_timeout=600)
    assert g0 is not None and g0.leader
    assert g0.args()[-3:] == ["10.0.0.21:29500", "--dist-timeout", "600"]
    v6 = node_group(["v6", "gpu-a"], "gpu-a", HOSTS)
    assert v6 is not None and v6.dist_init_addr == "[fd00::1]:20000"
    assert v6.leader_address == ("fd00::1", 20000)
    # an explicit address (another network between the boxes) wins
    ib = node_group(["gpu-a", "gpu-b"], "gpu-b", HOSTS, dist_init_addr="192.168.100.1:20000")
    assert ib is not None and ib.dist_init_addr == "192.168.100.1:20000"


@pytest.mark.parametrize("nodes", [[], ["gpu-a"]])
def test_one_node_or_none_is_a_single_node_server(nodes: list[str]) -> None:
    assert node_group(nodes, "gpu-a", HOSTS) is None


@pytest.mark.parametrize(("nodes", "host", "addr", "says"), [
    (["gpu-a", "gpu-b"], "gpu-c", None, "is not one of the group's nodes"),
    (["gpu-a", "gpu-a"], "gpu-a", None, "more than once"),
    (["gpu-a", "gpu-b"], "gpu-b", "10.0.0.21", "is not HOST:PORT"),
    (["gpu-a", "gpu-b"], "gpu-b", "10.0.0.21:99999", "is not HOST:PORT"),
])
def test_bad_groups_are_explained(nodes: list[str], host: str, addr: str | None,
                                  says: str) -> None:
    with pytest.raises(StageError, match=says):
        node_group(nodes, host, HOSTS, dist_init_addr=addr)


@pytest.mark.parametrize(("host", "reach", "local", "refused"), [
    ("gpu-b", "open", False, False),        # node 0 already listens
    ("gpu-b", "refused", False, False),     # node 0's box answers; its server is not up yet
    ("gpu-b", "timeout", False, True),      # filtered: the group would wait 30 minutes
    ("gpu-b", "unreachable", False, True),
    ("gpu-b", "unresolved", None, True),
    ("gpu-a", "refused", True, False),      # node 0 owns the address
    ("gpu-a", "refused", False, True),      # node 0 would not own the store's address
    ("gpu-a", "unresolved", None, False),   # unknown: SGLang itself will say
])
def test_dist_init_reachability(host: str, reach: str, local: bool | None,
                                refused: bool) -> None:
    g = node_group(["gpu-a", "gpu-b"], host, HOSTS)
    assert g is not None
    problem = reach_problem(g, reach, local, "x")
    assert (problem is not None) == refused, problem


def test_groups_builtin_lists_every_group_in_inventory_order(tmp_path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  b: {address: 127.0.0.2}\n  a: {address: 127.0.0.1, groups: [solo]}\n"
                   "groups:\n  pair: {hosts: [b, a]}\n")
    got = builtin_variables(load_inventory(inv), "a")["groups"]
    assert got == {"pair": ["b", "a"], "solo": ["a"]}
