"""The dist-init check of a multi-node rank on a real host (the agent's tcp_port probe): a node 0
that does not answer yet (its box rebooting) is waited for, then refused once `wait` is spent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from orchestrator.host import Host
from orchestrator.sglang.multinode import NodeGroup
from orchestrator.sglang.preflight import Report
from orchestrator.stages.base import StageContext
from orchestrator.stages.sglang_server.reads import check_group


@pytest.fixture
def silent_node0() -> Iterator[tuple[socket.socket, int]]:
    """A listener whose backlog is full: a connect to it gets no answer (times out)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fill = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fill.append(c)
    try:
        yield srv, port
    finally:
        for c in fill:
            c.close()
        srv.close()


def _rank1(port: int) -> NodeGroup:
    return NodeGroup(("node0", "node1"), 1, f"127.0.0.1:{port}")


def test_node0_that_answers_later_is_waited_for(local_host: Host, silent_node0,
                                                stage_ctx: Callable[..., StageContext]) -> None:
    srv, port = silent_node0
    ctx = stage_ctx()
    threading.Timer(0.6, srv.close).start()  # node 0's box is back: its kernel answers
    report = Report()
    check_group(local_host, ctx, _rank1(port), report, wait=10, probe_timeout=0.2)
    assert report.problems == []
    assert any("does not answer (timeout)" in m for m in ctx.progress_messages)


def test_node0_that_never_answers_is_refused(local_host: Host, silent_node0,
                                             stage_ctx: Callable[..., StageContext]) -> None:
    _, port = silent_node0
    report = Report()
    check_group(local_host, stage_ctx(), _rank1(port), report, wait=0.5, probe_timeout=0.2)
    assert report.rules == ["multinode.dist-init-unreachable"]
    assert f"cannot reach node 0's dist-init address 127.0.0.1:{port} (timeout" in \
        report.problems[0]
