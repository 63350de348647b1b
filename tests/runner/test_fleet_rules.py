"""The fleet gate's decisions (orchestrator.run.fleet), from tables: when a replica counts as in
rotation, when it may leave under --max-unavailable, when the barrier opens, what proves it
drained and what proves it back in; and the deploy flags that reach them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.run.fleet import (
    back_in,
    barrier_open,
    drained,
    draining,
    listed_ready,
    may_leave,
    out_of_rotation,
    routed_away,
    serving,
    unlisted,
)

A, B, C = "http://a:30000", "http://b:30000", "http://c:30000"


@dataclass(frozen=True)
class M:
    """A GET /workers entry as orchestrator.sglang.gateway.Member has it."""

    url: str
    status: str

    @property
    def ready(self) -> bool:
        return self.status == "ready"


@pytest.mark.parametrize(("listed", "own_health", "want"), [
    ([M(A, "ready")], False, True),            # the gateway's word wins over the replica's
    ([M(A, "not_ready")], True, False),        # listed but not Ready: out
    ([M(A, "draining")], True, False),         # being removed: out
    ([M(A, "pending")], True, False),
    ([M(B, "ready")], True, False),            # not listed: out, whatever its /health says
    ([], True, False),
    (None, True, True),                        # the gateway does not answer: its own /health
    (None, False, False),
])
def test_serving(listed: list[M] | None, own_health: bool, want: bool) -> None:
    asked: list[bool] = []

    def health() -> bool:
        asked.append(True)
        return own_health

    assert serving(A, listed, health) is want
    assert bool(asked) == (listed is None)  # its own /health only when the gateway is silent


def test_out_of_rotation_counts_every_desired_worker() -> None:
    urls = {"a": A, "b": B, "c": C, "ext": "http://x:1"}
    listed = [M(A, "ready"), M(B, "not_ready"), M("http://x:1", "ready")]
    assert out_of_rotation(urls, listed, lambda u: True) == {"b", "c"}
    assert out_of_rotation(urls, None, lambda u: u in (A, C)) == {"b", "ext"}


@pytest.mark.parametrize(("host", "out", "n", "want"), [
    ("a", set(), 1, True),
    ("a", {"b"}, 1, False),        # a replica already out (failed, crashed, ours) takes the slot
    ("a", {"a"}, 1, True),         # already out: it goes on
    ("a", {"a", "b"}, 1, True),
    ("a", {"b"}, 2, True),
    ("a", {"b", "c"}, 2, False),
    ("c", {"a", "b"}, 3, True),
])
def test_may_leave(host: str, out: set[str], n: int, want: bool) -> None:
    assert may_leave(host, out, n) is want


@pytest.mark.parametrize(("arrived", "done", "want"), [
    (set(), set(), False),
    ({"a", "b"}, set(), False),            # c still prepares: nobody leaves yet
    ({"a", "b"}, {"c"}, False),            # the gateway's host still walks
    ({"a", "b"}, {"c", "gw"}, True),
    (set(), {"a", "b", "c", "gw"}, True),
    ({"a", "b", "c", "gw"}, set(), True),
])
def test_barrier(arrived: set[str], done: set[str], want: bool) -> None:
    assert barrier_open({"a", "b", "c", "gw"}, arrived, done) is want


@pytest.mark.parametrize(("readings", "want"), [
    ([], False),
    ([0], False),                  # once is not proof
    ([0, 0], True),
    ([3, 0, 0], True),
    ([0, 0, 1], False),
    ([None, None], False),         # no answer is not drained
    ([0, None], False),
    ([None, 0, 0], True),
])
def test_drained(readings: list[int | None], want: bool) -> None:
    assert drained(readings) is want


@pytest.mark.parametrize(("listed", "away", "gone", "drain", "ready"), [
    (None, False, False, False, False),
    ([], True, True, False, False),
    ([M(A, "ready")], False, False, False, True),
    ([M(A, "draining")], True, False, True, False),
    ([M(A, "not_ready"), M(B, "ready")], False, False, False, False),
    ([M(B, "ready")], True, True, False, False),
])
def test_membership_reads(listed: list[M] | None, away: bool, gone: bool, drain: bool,
                          ready: bool) -> None:
    assert routed_away(A, listed) is away
    assert unlisted(A, listed) is gone
    assert draining(A, listed) is drain
    assert listed_ready(A, listed) is ready


@pytest.mark.parametrize(("chat_ok", "before", "now", "want"), [
    (True, 10, 11, True),
    (False, 10, 11, False),        # the counter grew (other traffic) but no chat passed
    (True, 10, 10, False),         # the chat went elsewhere
    (True, None, 11, False),       # no baseline: nothing proven
    (True, 10, None, False),
])
def test_back_in(chat_ok: bool, before: int | None, now: int | None, want: bool) -> None:
    assert back_in(chat_ok, before, now) is want


def test_cli_max_unavailable_reaches_every_deploy() -> None:
    from orchestrator.cli.main import build_parser

    parse = build_parser("deploy").parse_args
    args = parse(["deploy", "p.yaml", "-i", "i.yaml", "--max-unavailable", "2"])
    assert args.max_unavailable == 2 and not args.rolling
    rolled = parse(["deploy", "p.yaml", "-i", "i.yaml", "--rolling"])
    assert rolled.rolling and rolled.max_unavailable == 1  # an accepted alias, nothing more


def test_max_unavailable_below_one_is_refused() -> None:
    from orchestrator.cli.main import main

    assert main(["deploy", "p.yaml", "-i", "i.yaml", "--max-unavailable", "0"]) == 2


def test_console_shows_roll_steps() -> None:
    import io

    from orchestrator.cli.console import ConsoleView
    from orchestrator.events import ReplicaRoll

    out = io.StringIO()
    view = ConsoleView(stream=out, live=False)
    view.on_replica_roll(ReplicaRoll(host="gpu-1", step="drained",
                                     detail="0 requests in flight", duration_s=0.21))
    view.on_replica_roll(ReplicaRoll(host="gpu-2", step="failed", detail="its stages failed"))
    view.close()
    assert "[gpu-1] rolling: drained: 0 requests in flight (0.2s)" in out.getvalue()
    assert "[gpu-2] rolling: failed: its stages failed" in out.getvalue()
